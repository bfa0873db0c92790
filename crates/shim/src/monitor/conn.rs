//! The monitor's sockets: listeners bound in the state dir, and buffered
//! non-blocking connections (control or attach clients): what the monitor
//! could not write yet waits in `wbuf`, what it read but not yet handled in
//! `rbuf`. Nothing here blocks the loop.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use crust_shim_protocol::frame;

use super::Error;

/// Binds the non-blocking socket `name` (0600) in the state dir `dir`,
/// which is the current directory: a relative name keeps clear of
/// sun_path's 108-byte limit however deep the state dir is.
pub(super) fn bind_socket(dir: &Path, name: &str) -> Result<UnixListener, Error> {
    let _ = fs::remove_file(dir.join(name));
    let l = UnixListener::bind(name).map_err(Error::io(format!("binding {name}")))?;
    fs::set_permissions(dir.join(name), fs::Permissions::from_mode(0o600))
        .map_err(Error::io(format!("chmod {name}")))?;
    l.set_nonblocking(true).map_err(Error::io(name))?;
    Ok(l)
}

pub(super) struct Conn {
    pub sock: UnixStream,
    pub rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    wpos: usize,
    /// The peer closed (or half-closed) its side.
    pub eof: bool,
    /// Broken, or dropped on purpose: removed at the end of the round.
    pub dead: bool,
}

impl Conn {
    pub fn new(sock: UnixStream) -> io::Result<Conn> {
        sock.set_nonblocking(true)?;
        Ok(Conn {
            sock,
            rbuf: Vec::new(),
            wbuf: Vec::new(),
            wpos: 0,
            eof: false,
            dead: false,
        })
    }

    /// Bytes queued and not yet written.
    pub fn pending(&self) -> usize {
        self.wbuf.len() - self.wpos
    }

    pub fn queue_frame(&mut self, stream: u8, payload: &[u8]) {
        frame::encode_frame(&mut self.wbuf, stream, payload);
    }

    pub fn queue_message(&mut self, body: &[u8]) {
        frame::encode_message(&mut self.wbuf, body);
    }

    /// Writes what the socket takes now.
    pub fn flush(&mut self) {
        while self.wpos < self.wbuf.len() && !self.dead {
            match self.sock.write(&self.wbuf[self.wpos..]) {
                Ok(0) => self.dead = true,
                Ok(n) => self.wpos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => self.dead = true,
            }
        }
        if self.wpos == self.wbuf.len() {
            self.wbuf.clear();
            self.wpos = 0;
            if self.wbuf.capacity() > 64 * 1024 {
                self.wbuf = Vec::new();
            }
        } else if self.wpos > 64 * 1024 && self.wpos * 2 > self.wbuf.len() {
            self.wbuf.drain(..self.wpos);
            self.wpos = 0;
        }
    }

    /// Reads what is available (up to `limit` buffered bytes).
    pub fn fill(&mut self, limit: usize) {
        let mut buf = [0u8; 16 * 1024];
        while self.rbuf.len() < limit && !self.eof && !self.dead {
            match self.sock.read(&mut buf) {
                Ok(0) => self.eof = true,
                Ok(n) => self.rbuf.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => self.dead = true,
            }
        }
    }

    /// Flushed, or nobody left to flush to.
    pub fn settled(&self) -> bool {
        self.pending() == 0 || self.dead
    }
}
