//! The start-up handshake, reading side: the one line of JSON (a
//! [`StartupResult`]) a new monitor writes on its stdout pipe. Blocking:
//! the daemon's client runs it on a blocking thread, a container's monitor
//! in its single thread when it starts an exec session's monitor.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::messages::{MAX_MESSAGE, StartupResult};

/// Reads the start-up line from `fd` (the read end of the monitor's stdout
/// pipe), giving up after `timeout`. The line is returned without its
/// newline.
pub fn read_line(fd: OwnedFd, timeout: Duration) -> io::Result<Vec<u8>> {
    let deadline = Instant::now() + timeout;
    let mut f = File::from(fd);
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(nl) = out.iter().position(|&b| b == b'\n') {
            out.truncate(nl);
            return Ok(out);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no start-up result in time",
            ));
        }
        // Rounded up, so that the last wait does not end just short of the
        // deadline and spin.
        if !crust_linux::poll::wait_readable(f.as_fd(), left + Duration::from_millis(1))? {
            continue;
        }
        match f.read(&mut buf) {
            Ok(0) if out.is_empty() => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the monitor exited without a start-up result",
                ));
            }
            Ok(0) => return Ok(out),
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if out.len() > MAX_MESSAGE {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "start-up result too long",
                    ));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Decodes a start-up line; the error quotes the line.
pub fn parse(line: &[u8]) -> Result<StartupResult, String> {
    serde_json::from_slice(line).map_err(|e| {
        format!(
            "bad start-up result {:?}: {e}",
            String::from_utf8_lossy(line)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_one_line_or_times_out() {
        let (r, mut w) = std::io::pipe().unwrap();
        w.write_all(b"{\"ok\":{\"shim_pid\":2,\"pid\":3}}\nrest")
            .unwrap();
        let line = read_line(r.into(), Duration::from_secs(1)).unwrap();
        assert_eq!(
            parse(&line).unwrap(),
            StartupResult::Ok {
                shim_pid: 2,
                pid: 3
            }
        );
        let (r, w) = std::io::pipe().unwrap();
        let e = read_line(r.into(), Duration::from_millis(50)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        drop(w);
        let (r, w) = std::io::pipe().unwrap();
        drop(w);
        let e = read_line(r.into(), Duration::from_secs(1)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(parse(b"nope").unwrap_err().contains("\"nope\""));
    }
}
