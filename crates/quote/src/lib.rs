//! Bounded quoting of untrusted text in error messages.
//!
//! Every error that names a value a client, an image, a registry or a
//! plugin supplied shows at most [`MAX_QUOTED`] bytes of it: a 10 KB image
//! name or a 1 MB plugin message must not become a 20 KB `grpc-message`
//! header (over the 16 KiB clients accept, which then see `RST_STREAM`
//! instead of the error), nor flood a log line.
//!
//! - [`quote`]: `{:?}`-style, for values (`"a\nb"`), cut to
//!   [`MAX_QUOTED`] bytes of output, saying how long the value was.
//! - [`quote_bytes`]: the same for bytes that may not be UTF-8.
//! - [`clip`]: unquoted, for free text someone else wrote (a plugin's or a
//!   registry's error message), cut the same way, control characters
//!   escaped.

use std::fmt::{self, Write as _};

#[cfg(feature = "testing")]
pub mod testing;

/// The most bytes of one untrusted value an error message shows.
pub const MAX_QUOTED: usize = 256;

/// `value` as `{:?}` shows it, cut to at most [`MAX_QUOTED`] bytes of
/// escaped text; a cut value reads `"abc…"… (N bytes)`.
pub fn quote(value: &str) -> Quoted<'_> {
    Quoted(value)
}

/// [`quote`] for bytes: invalid UTF-8 is shown as `\xNN`.
pub fn quote_bytes(value: &[u8]) -> QuotedBytes<'_> {
    QuotedBytes(value)
}

/// [`quote`] for paths and OS strings (or anything that is one: `str`,
/// `String`, `Path`).
pub fn quote_os<T: AsRef<std::ffi::OsStr> + ?Sized>(value: &T) -> QuotedBytes<'_> {
    QuotedBytes(value.as_ref().as_encoded_bytes())
}

/// Free text, unquoted, cut like [`quote`]; control characters (but not
/// spaces) are escaped so one message cannot fake several log lines.
pub fn clip(text: &str) -> Clipped<'_> {
    Clipped(text)
}

/// See [`quote`].
/// `text` (free text, e.g. a lower layer's error that may repeat input)
/// cut to at most `max` bytes at a character boundary, marked when cut:
/// for messages longer than one quote but still bounded (a gRPC status).
pub fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &text[..end], text.len())
}

#[derive(Clone, Copy)]
pub struct Quoted<'a>(&'a str);

/// See [`quote_bytes`].
#[derive(Clone, Copy)]
pub struct QuotedBytes<'a>(&'a [u8]);

/// See [`clip`].
#[derive(Clone, Copy)]
pub struct Clipped<'a>(&'a str);

/// Writes the escaped chunks of a value until [`MAX_QUOTED`] bytes are out;
/// returns whether everything fit.
struct Budget<'f, 'g> {
    f: &'f mut fmt::Formatter<'g>,
    left: usize,
}

impl Budget<'_, '_> {
    /// Writes `piece` whole, or nothing and false when it does not fit.
    fn put(&mut self, piece: &str) -> Result<bool, fmt::Error> {
        if piece.len() > self.left {
            self.left = 0;
            return Ok(false);
        }
        self.left -= piece.len();
        self.f.write_str(piece)?;
        Ok(true)
    }

    /// One char as `{:?}` of a str escapes it (a `'` stays as it is).
    fn put_char(&mut self, c: char, quoted: bool) -> Result<bool, fmt::Error> {
        let mut buf = [0u8; 16];
        let mut w = Escaped {
            buf: &mut buf,
            len: 0,
        };
        match c {
            '\'' => w.push_str("'"),
            '"' if !quoted => w.push_str("\""),
            ' ' => w.push_str(" "),
            c if !quoted && !c.is_control() => w.push_char(c),
            c => {
                for e in c.escape_debug() {
                    w.push_char(e);
                }
            }
        }
        let len = w.len;
        let piece = std::str::from_utf8(&buf[..len]).map_err(|_| fmt::Error)?;
        self.put(piece)
    }
}

/// A tiny fixed buffer: the longest escape (`\u{10ffff}`) is 10 bytes.
struct Escaped<'a> {
    buf: &'a mut [u8; 16],
    len: usize,
}

impl Escaped<'_> {
    fn push_str(&mut self, s: &str) {
        self.buf[self.len..self.len + s.len()].copy_from_slice(s.as_bytes());
        self.len += s.len();
    }

    fn push_char(&mut self, c: char) {
        let mut tmp = [0u8; 4];
        self.push_str(c.encode_utf8(&mut tmp));
    }
}

fn write_quoted(
    f: &mut fmt::Formatter<'_>,
    chunks: impl Iterator<Item = Result<char, u8>>,
    total: usize,
    quoted: bool,
) -> fmt::Result {
    if quoted {
        f.write_char('"')?;
    }
    let mut budget = Budget {
        f,
        left: MAX_QUOTED,
    };
    let mut whole = true;
    for chunk in chunks {
        let fit = match chunk {
            Ok(c) => budget.put_char(c, quoted)?,
            Err(byte) => budget.put(&format!("\\x{byte:02x}"))?,
        };
        if !fit {
            whole = false;
            break;
        }
    }
    let f = budget.f;
    if quoted {
        f.write_char('"')?;
    }
    if !whole {
        write!(f, "... ({total} bytes)")?;
    }
    Ok(())
}

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_quoted(f, self.0.chars().map(Ok), self.0.len(), true)
    }
}

impl fmt::Debug for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for QuotedBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_quoted(f, utf8_chunks(self.0), self.0.len(), true)
    }
}

impl fmt::Debug for QuotedBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Clipped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_quoted(f, self.0.chars().map(Ok), self.0.len(), false)
    }
}

impl fmt::Debug for Clipped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The chars of `bytes`, with each byte of an invalid sequence on its own.
fn utf8_chunks(bytes: &[u8]) -> impl Iterator<Item = Result<char, u8>> + '_ {
    bytes.utf8_chunks().flat_map(|chunk| {
        chunk
            .valid()
            .chars()
            .map(Ok)
            .chain(chunk.invalid().iter().map(|&b| Err(b)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_cuts_at_a_char_boundary() {
        assert_eq!(truncate("short", 10), "short");
        assert_eq!(truncate(&"é".repeat(10), 5), "éé... (20 bytes)");
    }
    use proptest::prelude::*;

    #[test]
    fn short_values_read_as_debug() {
        for s in ["", "abc", "a\"b", "tab\there", "nul\0", "é'x", "a\\b"] {
            assert_eq!(quote(s).to_string(), format!("{s:?}"), "{s:?}");
        }
        assert_eq!(quote_bytes(b"a\xffb").to_string(), "\"a\\xffb\"");
        assert_eq!(clip("plain \"text\"\n").to_string(), "plain \"text\"\\n");
    }

    #[test]
    fn long_values_are_cut_and_say_their_length() {
        let long = "x".repeat(10_000);
        let q = quote(&long).to_string();
        assert_eq!(
            q,
            format!("\"{}\"... (10000 bytes)", "x".repeat(MAX_QUOTED))
        );
        let c = clip(&long).to_string();
        assert_eq!(c, format!("{}... (10000 bytes)", "x".repeat(MAX_QUOTED)));
        // An escape is never split.
        let nuls = "\0".repeat(1000);
        let q = quote(&nuls).to_string();
        assert!(
            q.starts_with("\"\\0\\0") && q.ends_with("\"... (1000 bytes)"),
            "{q}"
        );
    }

    proptest! {
        /// Whatever the value, the quote is at most MAX_QUOTED bytes plus
        /// the quotes and the length note, and a value that fits is shown
        /// exactly as `{:?}` shows it.
        #[test]
        fn quotes_are_bounded(s in any::<String>(), b in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let note = "\"\"... (18446744073709551615 bytes)".len();
            for out in [quote(&s).to_string(), quote_bytes(&b).to_string(), clip(&s).to_string()] {
                prop_assert!(out.len() <= MAX_QUOTED + note, "{} bytes: {out}", out.len());
            }
            if format!("{s:?}").len() <= MAX_QUOTED + 2 {
                prop_assert_eq!(quote(&s).to_string(), format!("{s:?}"));
            }
        }

        #[test]
        fn long_values_are_bounded(c in any::<char>(), n in 0usize..20_000) {
            let s = c.to_string().repeat(n);
            let out = quote(&s).to_string();
            prop_assert!(out.len() <= MAX_QUOTED + 40, "{}", out.len());
        }
    }
}
