//! Terminals of containers and exec processes: a pty is made where the
//! process runs (in the container's devpts), its master travels to the
//! monitor over a console socket (`SCM_RIGHTS`), and the monitor sizes it.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, UnixAddr, recvmsg, sendmsg};
use nix::sys::stat::SFlag;

/// Receives one file descriptor sent with `SCM_RIGHTS` on a Unix stream
/// socket (the pty master a runtime sends to its console socket).
pub fn recv_fd(sock: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let mut buf = [0u8; 256];
    let mut iov = [io::IoSliceMut::new(&mut buf)];
    let mut cmsg = nix::cmsg_space!([RawFd; 4]);
    let msg = recvmsg::<()>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut got: Vec<OwnedFd> = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for fd in fds {
                // SAFETY: the kernel just installed `fd` in our table for this
                // message; nothing else refers to it, so we take ownership.
                got.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    // Keep the first, close any extra.
    got.into_iter()
        .next()
        .ok_or_else(|| io::Error::other("no file descriptor in the console socket message"))
}

/// Sends `fd` over the connected Unix socket `sock` with `SCM_RIGHTS`, the
/// way runc sends a pty master to a console socket (the payload names it).
pub fn send_fd(sock: BorrowedFd<'_>, fd: BorrowedFd<'_>) -> io::Result<()> {
    let fds = [fd.as_raw_fd()];
    sendmsg::<UnixAddr>(
        sock.as_raw_fd(),
        &[io::IoSlice::new(b"/dev/ptmx")],
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )?;
    Ok(())
}

/// Both ends of a new pty.
#[derive(Debug)]
pub struct Pty {
    pub master: OwnedFd,
    pub slave: OwnedFd,
}

/// Opens a pty through this process's `/dev/ptmx`, sized `(width,
/// height)` if given, and checks that it is a real pty pair on devpts: in a
/// container's mount namespace /dev is the container's, so what /dev/ptmx
/// gives must not be trusted blindly (CVE-2025-52565 is the init's variant
/// of this).
pub fn open_pty(size: Option<(u16, u16)>) -> io::Result<Pty> {
    let size = size.map(|(w, h)| nix::pty::Winsize {
        ws_row: h,
        ws_col: w,
        ws_xpixel: 0,
        ws_ypixel: 0,
    });
    let pty = nix::pty::openpty(size.as_ref(), None)?;
    check_pty(&pty.master, &pty.slave)?;
    Ok(Pty {
        master: pty.master,
        slave: pty.slave,
    })
}

fn check_pty(master: &OwnedFd, slave: &OwnedFd) -> io::Result<()> {
    const DEVPTS_SUPER_MAGIC: i64 = 0x1cd1;
    const UNIX98_PTY_SLAVE_MAJOR: u64 = 136;
    let fs = nix::sys::statfs::fstatfs(master)
        .map_err(|e| io::Error::other(format!("statfs of the pty: {e}")))?;
    if fs.filesystem_type().0 as i64 != DEVPTS_SUPER_MAGIC {
        return Err(io::Error::other("/dev/ptmx is not on a devpts filesystem"));
    }
    let st = nix::sys::stat::fstat(slave.as_raw_fd())
        .map_err(|e| io::Error::other(format!("stat of the pty: {e}")))?;
    let major = nix::sys::stat::major(st.st_rdev);
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFCHR
        || !(UNIX98_PTY_SLAVE_MAJOR..UNIX98_PTY_SLAVE_MAJOR + 8).contains(&major)
    {
        return Err(io::Error::other("the pty slave is not a pty"));
    }
    Ok(())
}

/// `TIOCSWINSZ`: sets a terminal's window size.
pub fn set_winsize(fd: BorrowedFd<'_>, width: u16, height: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: height,
        ws_col: width,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: `fd` is an open descriptor for the duration of the call and
    // `ws` is a valid winsize that the kernel only reads.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `TIOCSCTTY`: makes the terminal `fd` the controlling terminal of this
/// process (a session leader without one).
pub fn set_controlling_terminal(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: `fd` is open for the duration of the call; TIOCSCTTY takes an
    // integer argument (0: do not steal it from another session).
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSCTTY, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl AsFd for Pty {
    /// The master: what the monitor reads and writes.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.master.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn only_a_devpts_ptmx_is_trusted() {
        // A container's /dev/ptmx is a symlink to pts/ptmx (devpts); the
        // host's is usually a device node on devtmpfs, whose masters are
        // not on devpts.
        let on_devpts = std::fs::symlink_metadata("/dev/ptmx").is_ok_and(|m| m.is_symlink());
        let r = open_pty(Some((80, 24)));
        assert_eq!(r.is_ok(), on_devpts, "{r:?}");
    }

    #[test]
    fn a_pty_travels_over_a_socket_and_can_be_sized() {
        let pty = nix::pty::openpty(None, None).unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        send_fd(a.as_fd(), pty.master.as_fd()).unwrap();
        let got = recv_fd(b.as_fd()).unwrap();
        set_winsize(got.as_fd(), 100, 30).unwrap();
        let mut ws = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: `pty.slave` is open and `ws` is a valid winsize the kernel
        // fills in.
        let r = unsafe { libc::ioctl(pty.slave.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
        assert_eq!(r, 0);
        assert_eq!((ws.ws_col, ws.ws_row), (100, 30));
    }

    #[test]
    fn a_message_without_a_descriptor_is_an_error() {
        let (a, b) = UnixStream::pair().unwrap();
        std::io::Write::write_all(&mut &a, b"x").unwrap();
        assert!(recv_fd(b.as_fd()).is_err());
    }
}
