//! The CRI log format, as containerd writes it:
//!
//! ```text
//! <RFC3339Nano timestamp> <stdout|stderr> <F|P> <content>\n
//! ```
//!
//! A line ends at `\n` (a `\r` right before it is dropped) and is written
//! with the tag `F`. A line longer than the cap is cut into parts of exactly
//! `cap` bytes tagged `P`, and its last part (1..=cap bytes) is tagged `F`.
//! What is left when the stream ends (no final newline) is written as `P`.
//! Timestamps have always nine fraction digits, in UTC:
//! `2016-10-06T00:17:09.669794202Z` (containerd's `timestampFormat`).
//!
//! Pure code, no I/O: the monitor feeds it what it reads and writes out what
//! it appends to `out`.

use std::time::{SystemTime, UNIX_EPOCH};

/// containerd's and conmon's default line-size cap.
pub const DEFAULT_LINE_CAP: usize = 16 * 1024;

/// The two output streams of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// A timestamp as containerd formats it, e.g. `2016-10-06T00:17:09.669794202Z`.
pub fn format_timestamp(t: SystemTime) -> String {
    let (secs, nanos) = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            // Before 1970: floor to the second below.
            let d = e.duration();
            let mut s = -(d.as_secs() as i64);
            let mut n = d.subsec_nanos();
            if n > 0 {
                s -= 1;
                n = 1_000_000_000 - n;
            }
            (s, n)
        }
    };
    format_unix(secs, nanos)
}

/// Nanoseconds since the epoch for `t` (saturating).
pub fn unix_nanos(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_nanos()).unwrap_or(i64::MAX),
    }
}

/// `secs` since the epoch plus `nanos` as `YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ`.
pub fn format_unix(secs: i64, nanos: u32) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Splits one stream's bytes into CRI log lines. Holds at most `cap` bytes
/// of an unfinished line between calls.
#[derive(Debug)]
pub struct LineSplitter {
    stream: Stream,
    cap: usize,
    pending: Vec<u8>,
}

impl LineSplitter {
    pub fn new(stream: Stream, cap: usize) -> Self {
        LineSplitter {
            stream,
            cap: cap.max(1),
            pending: Vec::new(),
        }
    }

    /// Bytes of an unfinished line held back.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Feed `data` read at `ts`; complete lines (and full-cap parts of long
    /// ones) are appended to `out`.
    pub fn push(&mut self, data: &[u8], ts: &str, out: &mut Vec<u8>) {
        let mut rest = data;
        while !rest.is_empty() {
            match rest.iter().position(|&b| b == b'\n') {
                Some(nl) => {
                    let (line, after) = rest.split_at(nl);
                    self.take_line(line, ts, out);
                    rest = &after[1..];
                }
                None => {
                    self.take_partial(rest, ts, out);
                    rest = &[];
                }
            }
        }
        if self.pending.is_empty() && self.pending.capacity() > 4096 {
            self.pending = Vec::new();
        }
    }

    /// The stream ended: what is held back is written as `P`.
    pub fn finish(&mut self, ts: &str, out: &mut Vec<u8>) {
        if !self.pending.is_empty() {
            let p = std::mem::take(&mut self.pending);
            write_line(out, ts, self.stream, b'P', &p);
        }
    }

    /// `line` (without its `\n`) completes the pending line.
    fn take_line(&mut self, line: &[u8], ts: &str, out: &mut Vec<u8>) {
        let mut line = line;
        if !self.pending.is_empty() {
            if self.pending.len() + line.len() <= self.cap {
                self.pending.extend_from_slice(line);
                let p = std::mem::take(&mut self.pending);
                write_line(out, ts, self.stream, b'F', trim_cr(&p));
                return;
            }
            // The held-back part fills up to the cap and the line goes on.
            let (head, rest) = line.split_at(self.cap - self.pending.len());
            self.pending.extend_from_slice(head);
            let p = std::mem::take(&mut self.pending);
            write_line(out, ts, self.stream, b'P', &p);
            line = rest;
        }
        // Nothing held back: no copy.
        while line.len() > self.cap {
            let (part, rest) = line.split_at(self.cap);
            write_line(out, ts, self.stream, b'P', part);
            line = rest;
        }
        write_line(out, ts, self.stream, b'F', trim_cr(line));
    }

    /// `data` has no newline: keep it, emitting a `P` part whenever more
    /// than `cap` bytes of the line are known.
    fn take_partial(&mut self, data: &[u8], ts: &str, out: &mut Vec<u8>) {
        let mut data = data;
        loop {
            let room = self.cap - self.pending.len();
            if data.len() <= room {
                self.pending.extend_from_slice(data);
                return;
            }
            // More than fits: the part is full and the line goes on.
            let (head, rest) = data.split_at(room);
            self.pending.extend_from_slice(head);
            let p = std::mem::take(&mut self.pending);
            write_line(out, ts, self.stream, b'P', &p);
            data = rest;
        }
    }
}

fn trim_cr(line: &[u8]) -> &[u8] {
    match line.last() {
        Some(b'\r') => &line[..line.len() - 1],
        _ => line,
    }
}

fn write_line(out: &mut Vec<u8>, ts: &str, stream: Stream, tag: u8, content: &[u8]) {
    out.reserve(ts.len() + content.len() + 12);
    out.extend_from_slice(ts.as_bytes());
    out.push(b' ');
    out.extend_from_slice(stream.as_str().as_bytes());
    out.push(b' ');
    out.push(tag);
    out.push(b' ');
    out.extend_from_slice(content);
    out.push(b'\n');
}

/// One parsed log line (for tests and for readers of log files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine<'a> {
    pub timestamp: &'a str,
    pub stream: &'a str,
    pub partial: bool,
    pub content: &'a [u8],
}

/// Parses one line of a CRI log file (without its `\n`).
pub fn parse_line(line: &[u8]) -> Option<LogLine<'_>> {
    let mut it = line.splitn(4, |&b| b == b' ');
    let timestamp = std::str::from_utf8(it.next()?).ok()?;
    let stream = std::str::from_utf8(it.next()?).ok()?;
    let partial = match it.next()? {
        b"P" => true,
        b"F" => false,
        _ => return None,
    };
    let content = it.next().unwrap_or(b"");
    Some(LogLine {
        timestamp,
        stream,
        partial,
        content,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const TS: &str = "2016-10-06T00:17:09.669794202Z";

    fn run(cap: usize, chunks: &[&[u8]], finish: bool) -> String {
        let mut s = LineSplitter::new(Stream::Stdout, cap);
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, TS, &mut out);
        }
        if finish {
            s.finish(TS, &mut out);
        }
        String::from_utf8(out).unwrap()
    }

    fn lines(s: &str) -> Vec<String> {
        // Not str::lines: it would eat a `\r` before the `\n`.
        s.split_terminator('\n')
            .map(|l| l.strip_prefix(TS).unwrap().to_string())
            .collect()
    }

    #[test]
    fn timestamp_like_containerd() {
        let t = UNIX_EPOCH + Duration::new(1_475_713_029, 669_794_202);
        assert_eq!(format_timestamp(t), "2016-10-06T00:17:09.669794202Z");
        // Always nine digits, even with trailing zeros.
        assert_eq!(format_unix(0, 0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(
            format_unix(951_782_400, 5),
            "2000-02-29T00:00:00.000000005Z"
        );
        assert_eq!(
            format_unix(4_102_444_799, 999_999_999),
            "2099-12-31T23:59:59.999999999Z"
        );
        assert_eq!(format_unix(-1, 0), "1969-12-31T23:59:59.000000000Z");
        let before = UNIX_EPOCH - Duration::new(0, 1);
        assert_eq!(format_timestamp(before), "1969-12-31T23:59:59.999999999Z");
        assert_eq!(unix_nanos(UNIX_EPOCH + Duration::new(2, 3)), 2_000_000_003);
    }

    #[test]
    fn timestamp_matches_a_date_table() {
        // Every day of a leap year and a century year round-trips through a
        // simple reference calendar.
        let mut days = 0i64;
        for year in 1970..2101 {
            let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
            let lens = [
                31,
                if leap { 29 } else { 28 },
                31,
                30,
                31,
                30,
                31,
                31,
                30,
                31,
                30,
                31,
            ];
            for (m, len) in lens.iter().enumerate() {
                for d in 1..=*len {
                    assert_eq!(civil_from_days(days), (year, m as u32 + 1, d), "day {days}");
                    days += 1;
                }
            }
        }
    }

    #[test]
    fn full_lines_both_streams() {
        assert_eq!(
            lines(&run(16, &[b"a\nbc\n"], true)),
            [" stdout F a", " stdout F bc"]
        );
        let mut s = LineSplitter::new(Stream::Stderr, 16);
        let mut out = Vec::new();
        s.push(b"oops\n", TS, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("{TS} stderr F oops\n")
        );
    }

    #[test]
    fn empty_lines() {
        assert_eq!(
            lines(&run(16, &[b"\n\n"], true)),
            [" stdout F ", " stdout F "]
        );
    }

    #[test]
    fn crlf_is_trimmed_once() {
        assert_eq!(
            lines(&run(16, &[b"a\r\n", b"b\r\r\n", b"\r\n"], true)),
            [" stdout F a", " stdout F b\r", " stdout F "]
        );
        // Split between \r and \n.
        assert_eq!(lines(&run(16, &[b"x\r", b"\n"], true)), [" stdout F x"]);
        // A lone \r in the middle stays.
        assert_eq!(lines(&run(16, &[b"a\rb\n"], true)), [" stdout F a\rb"]);
    }

    #[test]
    fn line_split_over_reads() {
        assert_eq!(
            lines(&run(16, &[b"he", b"ll", b"o\nwo", b"rld\n"], true)),
            [" stdout F hello", " stdout F world"]
        );
    }

    #[test]
    fn unfinished_line_at_eof_is_partial() {
        assert_eq!(
            lines(&run(16, &[b"a\nno newline"], true)),
            [" stdout F a", " stdout P no newline"]
        );
        // Not finished yet: held back.
        assert_eq!(lines(&run(16, &[b"a\nno newline"], false)), [" stdout F a"]);
    }

    #[test]
    fn long_lines_are_cut_at_the_cap() {
        // Exactly the cap: one full line.
        assert_eq!(lines(&run(4, &[b"abcd\n"], true)), [" stdout F abcd"]);
        // One more: a full part and the rest.
        assert_eq!(
            lines(&run(4, &[b"abcde\n"], true)),
            [" stdout P abcd", " stdout F e"]
        );
        // Twice the cap, fed byte by byte.
        let bytes = b"abcdefgh\n";
        let chunks: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(
            lines(&run(4, &chunks, true)),
            [" stdout P abcd", " stdout F efgh"]
        );
        // A cap-sized part followed by EOF with no newline.
        assert_eq!(
            lines(&run(4, &[b"abcdefgh"], true)),
            [" stdout P abcd", " stdout P efgh"]
        );
        // Pending bytes plus a long tail.
        assert_eq!(
            lines(&run(4, &[b"ab", b"cdefghij\n"], true)),
            [" stdout P abcd", " stdout P efgh", " stdout F ij"]
        );
    }

    #[test]
    fn one_mib_line() {
        let mut data = vec![b'x'; 1 << 20];
        data.push(b'\n');
        data.extend_from_slice(b"tail\n");
        let mut s = LineSplitter::new(Stream::Stdout, DEFAULT_LINE_CAP);
        let mut out = Vec::new();
        for c in data.chunks(5000) {
            s.push(c, TS, &mut out);
        }
        s.finish(TS, &mut out);
        let parsed: Vec<LogLine> = out
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| parse_line(l).unwrap())
            .collect();
        assert_eq!(parsed.len(), 64 + 1);
        assert!(
            parsed[..63]
                .iter()
                .all(|l| l.partial && l.content.len() == DEFAULT_LINE_CAP)
        );
        assert!(!parsed[63].partial && parsed[63].content.len() == DEFAULT_LINE_CAP);
        let total: usize = parsed[..64].iter().map(|l| l.content.len()).sum();
        assert_eq!(total, 1 << 20);
        assert_eq!(parsed[64].content, b"tail");
        assert_eq!(s.pending(), 0);
    }

    #[test]
    fn parse_round_trip() {
        let l = parse_line(b"2016-10-06T00:17:09.669794202Z stderr P a b c").unwrap();
        assert_eq!(l.timestamp, TS);
        assert_eq!(l.stream, "stderr");
        assert!(l.partial);
        assert_eq!(l.content, b"a b c");
        assert!(parse_line(b"garbage").is_none());
    }
}
