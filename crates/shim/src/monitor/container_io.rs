//! The monitored process's stdio, monitor side: its stdout and stderr
//! pipes (or the pty master) read into the CRI log and out to attach
//! clients, its stdin written from attach clients, and the plumbing set up
//! before the runtime creates the process (pipes, or a console socket that
//! receives the pty master).

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crust_linux::console;
use crust_linux::poll::PollFlags;
use crust_linux::process as sys;
use crust_shim_protocol::{CONSOLE_SOCKET, RuntimeConfig, STREAM_STDERR, STREAM_STDOUT};

use super::container_log::LogFile;
use super::{Error, PollSet, Tok};
use crate::logfmt::{self, LineSplitter, Stream};
use crate::runtime::Stdio;

/// Bytes read from a container pipe at a time.
const READ_CHUNK: usize = 32 * 1024;
/// Stdin bytes buffered before attach clients are no longer read.
const STDIN_HIGH_WATER: usize = 64 * 1024;

/// A container output: a pipe or the pty master.
struct Output {
    file: Option<File>,
    stream: Stream,
    splitter: LineSplitter,
}

impl Output {
    fn new(file: File, stream: Stream) -> Output {
        Output {
            file: Some(file),
            stream,
            splitter: LineSplitter::new(stream, logfmt::DEFAULT_LINE_CAP),
        }
    }
}

/// The process's stdin (a pipe, or the pty master again).
struct Stdin {
    file: Option<File>,
    buf: Vec<u8>,
    close_when_flushed: bool,
}

impl Stdin {
    fn new(file: File) -> Stdin {
        Stdin {
            file: Some(file),
            buf: Vec::new(),
            close_when_flushed: false,
        }
    }

    fn flush(&mut self) {
        if let Some(f) = self.file.as_mut() {
            let mut pos = 0;
            while pos < self.buf.len() {
                match f.write(&self.buf[pos..]) {
                    Ok(0) => break,
                    Ok(n) => pos += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        // The reader is gone (EPIPE) or the tty hung up.
                        self.file = None;
                        self.buf = Vec::new();
                        return;
                    }
                }
            }
            self.buf.drain(..pos);
        } else {
            self.buf = Vec::new();
        }
        if self.buf.is_empty() && self.close_when_flushed {
            // A tty's master is also the output: only stop writing to it.
            self.file = None;
        }
    }
}

/// The process's stdio and log, once it runs.
pub(super) struct ContainerIo {
    outputs: Vec<Output>,
    stdin: Option<Stdin>,
    pty: Option<OwnedFd>,
    log: Option<LogFile>,
    /// `stdin_once`: the first stdin client that leaves closes the
    /// process's stdin.
    close_stdin_on_eof: bool,
}

impl ContainerIo {
    pub fn new(plumbing: Plumbing, log: Option<LogFile>, stdin_once: bool) -> ContainerIo {
        ContainerIo {
            outputs: plumbing.outputs,
            stdin: plumbing.stdin,
            pty: plumbing.pty,
            log,
            close_stdin_on_eof: stdin_once,
        }
    }

    /// Adds the outputs (when they are to be read) and stdin (when there is
    /// something to write). Returns whether stdin has room for more from
    /// attach clients.
    pub fn register<'a>(&'a self, set: &mut PollSet<'a>, read_outputs: bool) -> bool {
        if read_outputs {
            for (i, o) in self.outputs.iter().enumerate() {
                if let Some(f) = &o.file {
                    set.add(f.as_fd(), PollFlags::POLLIN, Tok::Output(i));
                }
            }
        }
        match &self.stdin {
            Some(s) => {
                if let (Some(f), false) = (&s.file, s.buf.is_empty()) {
                    set.add(f.as_fd(), PollFlags::POLLOUT, Tok::Stdin);
                }
                s.buf.len() < STDIN_HIGH_WATER
            }
            None => true,
        }
    }

    /// Reads output `i`: a few chunks per wake-up (keeps the loop fair), or
    /// with `drain` until nothing is left (after the exit; bounded too, in
    /// case a process outside the container keeps writing). Each chunk goes
    /// to the log, then to `fan_out` (the attach clients).
    pub fn read_output(&mut self, i: usize, drain: bool, mut fan_out: impl FnMut(u8, &[u8])) {
        let mut buf = vec![0u8; READ_CHUNK];
        let mut rounds = if drain { 256 } else { 4 };
        while rounds > 0 {
            rounds -= 1;
            let Some(f) = self.outputs[i].file.as_mut() else {
                return;
            };
            match f.read(&mut buf) {
                Ok(0) => return self.output_eof(i),
                Ok(n) => {
                    let o = &mut self.outputs[i];
                    if let Some(log) = self.log.as_mut() {
                        let ts = logfmt::format_timestamp(SystemTime::now());
                        let mut out = Vec::with_capacity(n + 64);
                        o.splitter.push(&buf[..n], &ts, &mut out);
                        log.write(&out);
                    }
                    let stream = match o.stream {
                        Stream::Stdout => STREAM_STDOUT,
                        Stream::Stderr => STREAM_STDERR,
                    };
                    fan_out(stream, &buf[..n]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // EIO: the pty's other side is closed.
                Err(_) => return self.output_eof(i),
            }
        }
    }

    pub fn output_count(&self) -> usize {
        self.outputs.len()
    }

    fn output_eof(&mut self, i: usize) {
        let o = &mut self.outputs[i];
        o.file = None;
        if let Some(log) = self.log.as_mut() {
            let mut out = Vec::new();
            o.splitter
                .finish(&logfmt::format_timestamp(SystemTime::now()), &mut out);
            log.write(&out);
        }
    }

    /// After the exit (and a final drain): writes what is left of partial
    /// lines and closes everything.
    pub fn close(&mut self) {
        let ts = logfmt::format_timestamp(SystemTime::now());
        let mut out = Vec::new();
        for o in &mut self.outputs {
            o.splitter.finish(&ts, &mut out);
            o.file = None;
        }
        if let Some(log) = self.log.as_mut() {
            log.write(&out);
        }
        self.stdin = None;
    }

    /// Queues stdin from an attach client (dropped once stdin is closed).
    pub fn write_stdin(&mut self, data: &[u8]) {
        if let Some(s) = self.stdin.as_mut()
            && s.file.is_some()
            && !s.close_when_flushed
        {
            s.buf.extend_from_slice(data);
            s.flush();
        }
    }

    pub fn flush_stdin(&mut self) {
        if let Some(s) = self.stdin.as_mut() {
            s.flush();
        }
    }

    /// A client with stdin closed its stdin or left: with `stdin_once` the
    /// process's stdin closes once what was queued is written.
    pub fn client_stdin_closed(&mut self) {
        if !self.close_stdin_on_eof {
            return;
        }
        if let Some(s) = self.stdin.as_mut() {
            s.close_when_flushed = true;
            s.flush();
        }
    }

    /// Sets the tty's window size.
    pub fn resize(&self, width: u16, height: u16) -> Result<(), Error> {
        let pty = self
            .pty
            .as_ref()
            .ok_or(Error::FailedPrecondition("no tty"))?;
        console::set_winsize(pty.as_fd(), width, height).map_err(Error::io("resize"))
    }

    /// Output dropped from the log so far (its size cap, or no file after a
    /// failed reopen).
    pub fn log_dropped_bytes(&self) -> u64 {
        self.log.as_ref().map_or(0, LogFile::dropped_bytes)
    }

    pub fn reopen_log(&mut self) -> Result<(), Error> {
        match self.log.as_mut() {
            Some(l) => l.reopen().map_err(super::container_log::open_error),
            None => Ok(()),
        }
    }
}

/// The stdio plumbing of a new process, monitor side, until the runtime
/// has created it.
pub(super) struct Plumbing {
    outputs: Vec<Output>,
    stdin: Option<Stdin>,
    pty: Option<OwnedFd>,
    console: Option<UnixListener>,
}

/// A non-blocking pipe for the monitor's end: (reader, the child's writer).
pub(super) fn output_pipe() -> Result<(File, OwnedFd), Error> {
    let (r, w) = io::pipe().map_err(Error::io("pipe"))?;
    let r = File::from(OwnedFd::from(r));
    sys::set_nonblocking(r.as_fd()).map_err(Error::io("pipe"))?;
    Ok((r, w.into()))
}

impl Plumbing {
    /// Pipes for stdout and stderr (and stdin if asked), or with a tty a
    /// console socket in `dir` that will receive the pty master. Returns
    /// the child's ends for the runtime.
    pub fn new(tty: bool, stdin: bool, dir: &Path) -> Result<(Plumbing, Stdio), Error> {
        if tty {
            let l = super::conn::bind_socket(dir, CONSOLE_SOCKET)?;
            let p = Plumbing {
                outputs: Vec::new(),
                stdin: None,
                pty: None,
                console: Some(l),
            };
            return Ok((p, Stdio::default()));
        }
        let (out_r, out_w) = output_pipe()?;
        let (err_r, err_w) = output_pipe()?;
        let mut child = Stdio {
            stdin: None,
            stdout: Some(out_w),
            stderr: Some(err_w),
        };
        let mut st = None;
        if stdin {
            let (r, w) = io::pipe().map_err(Error::io("pipe"))?;
            let w = File::from(OwnedFd::from(w));
            sys::set_nonblocking(w.as_fd()).map_err(Error::io("pipe"))?;
            child.stdin = Some(r.into());
            st = Some(Stdin::new(w));
        }
        let p = Plumbing {
            outputs: vec![
                Output::new(out_r, Stream::Stdout),
                Output::new(err_r, Stream::Stderr),
            ],
            stdin: st,
            pty: None,
            console: None,
        };
        Ok((p, child))
    }

    /// Whether the runtime is to send a pty master.
    pub fn wants_console(&self) -> bool {
        self.console.is_some()
    }

    /// After create/exec: takes the pty master the runtime sent.
    pub fn receive_console(&mut self, dir: &Path, stdin: bool) -> Result<(), Error> {
        let Some(l) = self.console.take() else {
            return Ok(());
        };
        let _ = fs::remove_file(dir.join(CONSOLE_SOCKET));
        let (sock, _) = l
            .accept()
            .map_err(Error::io("the runtime sent no pty to the console socket"))?;
        sock.set_nonblocking(false)
            .map_err(Error::io("console socket"))?;
        let master = console::recv_fd(sock.as_fd()).map_err(Error::io("receiving the pty"))?;
        sys::set_nonblocking(master.as_fd()).map_err(Error::io("pty"))?;
        let dup = |fd: &OwnedFd| fd.try_clone().map_err(Error::io("dup"));
        self.pty = Some(dup(&master)?);
        if stdin {
            self.stdin = Some(Stdin::new(File::from(dup(&master)?)));
        }
        self.outputs = vec![Output::new(File::from(master), Stream::Stdout)];
        Ok(())
    }

    pub fn has_pty(&self) -> bool {
        self.pty.is_some()
    }

    /// Sizes the pty (if any) as `size` says.
    pub fn size_pty(&self, size: Option<(u16, u16)>) {
        if let (Some(pty), Some((w, h))) = (&self.pty, size) {
            let _ = console::set_winsize(pty.as_fd(), w, h);
        }
    }
}

/// A symlink removed when dropped.
pub(super) struct ShortLink(PathBuf);

impl Drop for ShortLink {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// The path a runtime gets for our console socket. When the socket's path
/// is too long for a socket address, a CLI runtime gets a short symlink to
/// it in the temp dir (a relative path would not do: runc chdirs into the
/// bundle). The symlink's target is in our 0700 state dir, so only root
/// can connect through it; a name that exists already is never reused.
pub(super) fn console_arg(
    dir: &Path,
    cfg: &RuntimeConfig,
) -> Result<(PathBuf, Option<ShortLink>), Error> {
    let abs = dir.join(CONSOLE_SOCKET);
    match cfg {
        // libcontainer connects through a short symlink of its own.
        RuntimeConfig::Embedded { .. } => Ok((abs, None)),
        RuntimeConfig::Cli { .. } if abs.as_os_str().len() < 100 => Ok((abs, None)),
        RuntimeConfig::Cli { .. } => {
            let mut random = [0u8; 4];
            getrandom::fill(&mut random)
                .map_err(|e| Error::Internal(format!("random bytes: {e}")))?;
            let link = std::env::temp_dir().join(format!(
                "crust-console-{}-{:08x}",
                std::process::id(),
                u32::from_ne_bytes(random)
            ));
            std::os::unix::fs::symlink(&abs, &link)
                .map_err(Error::io(format!("console socket link {}", link.display())))?;
            Ok((link.clone(), Some(ShortLink(link))))
        }
    }
}
