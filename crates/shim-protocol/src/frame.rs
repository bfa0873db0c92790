//! Wire encoding shared by the monitor and the client: length-prefixed
//! control messages and attach frames (see [`crate::messages`]).

use std::io::{self, Read, Write};

use crate::messages::{MAX_FRAME, MAX_MESSAGE};

/// Appends one attach frame to `out`.
pub fn encode_frame(out: &mut Vec<u8>, stream: u8, payload: &[u8]) {
    out.reserve(5 + payload.len());
    out.push(stream);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

/// Appends one length-prefixed message to `out`.
pub fn encode_message(out: &mut Vec<u8>, body: &[u8]) {
    out.reserve(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
}

/// Why a buffer could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// The announced length is over the limit.
    TooLarge(usize),
}

/// Takes one attach frame off the front of `buf`: `Ok(None)` if incomplete.
/// Returns (stream, payload) and removes it from `buf`.
pub fn take_frame(buf: &mut Vec<u8>) -> Result<Option<(u8, Vec<u8>)>, DecodeError> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if len > MAX_FRAME {
        return Err(DecodeError::TooLarge(len));
    }
    if buf.len() < 5 + len {
        return Ok(None);
    }
    let stream = buf[0];
    let payload = buf[5..5 + len].to_vec();
    buf.drain(..5 + len);
    Ok(Some((stream, payload)))
}

/// Takes one length-prefixed message off the front of `buf`.
pub fn take_message(buf: &mut Vec<u8>) -> Result<Option<Vec<u8>>, DecodeError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > MAX_MESSAGE {
        return Err(DecodeError::TooLarge(len));
    }
    if buf.len() < 4 + len {
        return Ok(None);
    }
    let body = buf[4..4 + len].to_vec();
    buf.drain(..4 + len);
    Ok(Some(body))
}

/// Blocking: writes one attach frame.
pub fn write_frame<W: Write>(w: &mut W, stream: u8, payload: &[u8]) -> io::Result<()> {
    let mut hdr = [0u8; 5];
    hdr[0] = stream;
    hdr[1..].copy_from_slice(&(payload.len() as u32).to_be_bytes());
    w.write_all(&hdr)?;
    w.write_all(payload)
}

/// Blocking: reads one attach frame; `Ok(None)` on a clean EOF between
/// frames.
pub fn read_frame<R: Read>(r: &mut R) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut hdr = [0u8; 5];
    if !read_exact_or_eof(r, &mut hdr)? {
        return Ok(None);
    }
    let len = u32::from_be_bytes([hdr[1], hdr[2], hdr[3], hdr[4]]) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes is over the limit"),
        ));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok(Some((hdr[0], payload)))
}

/// Blocking: writes one length-prefixed message.
pub fn write_message<W: Write>(w: &mut W, body: &[u8]) -> io::Result<()> {
    let mut out = Vec::with_capacity(4 + body.len());
    encode_message(&mut out, body);
    w.write_all(&out)
}

/// Blocking: reads one length-prefixed message; `Ok(None)` on a clean EOF.
pub fn read_message<R: Read>(r: &mut R) -> io::Result<Option<Vec<u8>>> {
    let mut hdr = [0u8; 4];
    if !read_exact_or_eof(r, &mut hdr)? {
        return Ok(None);
    }
    let len = u32::from_be_bytes(hdr) as usize;
    if len > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("message of {len} bytes is over the limit"),
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(Some(body))
}

/// Fills `buf`; false on EOF before the first byte, an error on EOF inside.
fn read_exact_or_eof<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_incrementally() {
        let mut wire = Vec::new();
        encode_frame(&mut wire, 1, b"hello");
        encode_frame(&mut wire, 0, b"");
        encode_frame(&mut wire, 4, &[0, 80, 0, 24]);
        let mut buf = Vec::new();
        let mut got = Vec::new();
        for b in wire {
            buf.push(b);
            while let Some(f) = take_frame(&mut buf).unwrap() {
                got.push(f);
            }
        }
        assert_eq!(
            got,
            vec![(1, b"hello".to_vec()), (0, vec![]), (4, vec![0, 80, 0, 24])]
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn oversized_frames_are_refused() {
        let mut buf = vec![1u8];
        buf.extend_from_slice(&((MAX_FRAME as u32) + 1).to_be_bytes());
        assert!(take_frame(&mut buf).is_err());
        let mut m = Vec::new();
        m.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(take_message(&mut m).is_err());
        assert!(read_message(&mut &m[..]).is_err());
    }

    #[test]
    fn blocking_helpers() {
        let mut wire = Vec::new();
        write_message(&mut wire, b"{}").unwrap();
        write_frame(&mut wire, 2, b"err").unwrap();
        let mut r = &wire[..];
        assert_eq!(read_message(&mut r).unwrap().unwrap(), b"{}");
        assert_eq!(read_frame(&mut r).unwrap().unwrap(), (2, b"err".to_vec()));
        assert!(read_frame(&mut r).unwrap().is_none());
        // EOF inside a frame is an error.
        let mut short = &[1u8, 0, 0][..];
        assert!(read_frame(&mut short).is_err());
    }
}
