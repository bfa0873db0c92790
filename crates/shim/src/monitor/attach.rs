//! Attach clients: each gets all output produced while it is attached and
//! may send stdin and resizes (see the framing in
//! `crust_shim_protocol::messages`). A container's slow client is dropped
//! rather than slowing the container and its log; an exec session instead
//! stops reading the process's output until its clients catch up.

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::os::unix::net::UnixListener;
use std::time::Instant;

use crust_linux::poll::PollFlags;
use crust_shim_protocol::{
    MAX_FRAME, STREAM_EXIT, STREAM_RESIZE, STREAM_STDIN, STREAM_STDIN_OPEN, frame,
};

use super::conn::Conn;
use super::{Ids, Mode, Monitor, PollSet, Tok};

/// Output queued for one attach client of a container before it is dropped
/// as too slow (the container and its log do not wait for it).
const ATTACH_SLOW_LIMIT: usize = 4 << 20;

struct AttachClient {
    conn: Conn,
    /// It sent stdin or declared it.
    had_stdin: bool,
    /// Its stdin ended (closed, or the client half-closed).
    stdin_done: bool,
}

/// The attach listener and its clients.
pub(super) struct Attachers {
    listener: UnixListener,
    clients: BTreeMap<u64, AttachClient>,
    /// Some client attached at some point.
    had_client: bool,
    /// Exec sessions: when to give up waiting for the first client.
    deadline: Option<Instant>,
}

/// What one wake-up of a client asked for.
#[derive(Default)]
struct AttachInput {
    stdin: Vec<u8>,
    closed_stdin: bool,
    resize: Option<(u16, u16)>,
}

impl Attachers {
    pub fn new(listener: UnixListener, deadline: Option<Instant>) -> Attachers {
        Attachers {
            listener,
            clients: BTreeMap::new(),
            had_client: false,
            deadline,
        }
    }

    pub fn register_listener<'a>(&'a self, set: &mut PollSet<'a>) {
        set.add(self.listener.as_fd(), PollFlags::POLLIN, Tok::AttachListen);
    }

    /// Clients: readable while stdin has room, writable while output waits.
    pub fn register<'a>(&'a self, set: &mut PollSet<'a>, stdin_room: bool) {
        for (id, c) in &self.clients {
            let mut ev = PollFlags::empty();
            if !c.conn.eof && stdin_room {
                ev |= PollFlags::POLLIN;
            }
            if c.conn.pending() > 0 {
                ev |= PollFlags::POLLOUT;
            }
            set.add(c.conn.sock.as_fd(), ev, Tok::Attach(*id));
        }
    }

    pub fn accept(&mut self, ids: &mut Ids) {
        while let Ok((sock, _)) = self.listener.accept() {
            let Ok(conn) = Conn::new(sock) else { continue };
            self.clients.insert(
                ids.next(),
                AttachClient {
                    conn,
                    had_stdin: false,
                    stdin_done: false,
                },
            );
            self.had_client = true;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    pub fn had_client(&self) -> bool {
        self.had_client
    }

    /// The most output queued for any one client.
    pub fn max_pending(&self) -> usize {
        self.clients
            .values()
            .map(|c| c.conn.pending())
            .max()
            .unwrap_or(0)
    }

    /// Everything sent, or nobody left to send it to.
    pub fn flushed(&self) -> bool {
        self.clients.values().all(|c| c.conn.settled())
    }

    /// Queues output for every client; with `drop_slow`, a client too far
    /// behind is dropped.
    pub fn broadcast(&mut self, stream: u8, data: &[u8], drop_slow: bool) {
        for c in self.clients.values_mut() {
            c.conn.queue_frame(stream, data);
            c.conn.flush();
            if drop_slow && c.conn.pending() > ATTACH_SLOW_LIMIT {
                eprintln!("crust-shim: dropping an attach client that does not keep up");
                c.conn.dead = true;
            }
        }
    }

    /// Sends every client the exit frame (the JSON exit record).
    pub fn send_exit(&mut self, payload: &[u8]) {
        for c in self.clients.values_mut() {
            c.conn.queue_frame(STREAM_EXIT, payload);
            c.conn.flush();
        }
    }

    /// Flushes and reads client `id`, and takes the frames it sent.
    fn on_ready(&mut self, id: u64, flags: PollFlags) -> AttachInput {
        let mut input = AttachInput::default();
        let Some(c) = self.clients.get_mut(&id) else {
            return input;
        };
        if flags.contains(PollFlags::POLLOUT) {
            c.conn.flush();
        }
        if flags.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
            c.conn.fill(MAX_FRAME + 5 + 16 * 1024);
        }
        loop {
            match frame::take_frame(&mut c.conn.rbuf) {
                Ok(Some((STREAM_STDIN, payload))) => {
                    if c.stdin_done {
                        continue;
                    }
                    c.had_stdin = true;
                    if payload.is_empty() {
                        c.stdin_done = true;
                        input.closed_stdin = true;
                    } else {
                        input.stdin.extend_from_slice(&payload);
                    }
                }
                Ok(Some((STREAM_STDIN_OPEN, _))) => {
                    c.had_stdin = true;
                }
                Ok(Some((STREAM_RESIZE, p))) if p.len() == 4 => {
                    input.resize = Some((
                        u16::from_be_bytes([p[0], p[1]]),
                        u16::from_be_bytes([p[2], p[3]]),
                    ));
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => {
                    c.conn.dead = true;
                    break;
                }
            }
        }
        // The client's input ended (it closed or half-closed): no more
        // stdin from it. It is gone only on a hang-up; a half-closed client
        // still gets output.
        if c.conn.eof && c.had_stdin && !c.stdin_done {
            c.stdin_done = true;
            input.closed_stdin = true;
        }
        if c.conn.eof && flags.intersects(PollFlags::POLLHUP | PollFlags::POLLERR) {
            c.conn.dead = true;
        }
        input
    }

    /// Removes the dead clients; for each, whether it left with its stdin
    /// still open.
    fn take_dead(&mut self) -> Vec<bool> {
        let dead: Vec<u64> = self
            .clients
            .iter()
            .filter(|(_, c)| c.conn.dead)
            .map(|(id, _)| *id)
            .collect();
        dead.into_iter()
            .filter_map(|id| self.clients.remove(&id))
            .map(|c| c.had_stdin && !c.stdin_done)
            .collect()
    }

    /// The exec session's deadline for its first client, while it applies.
    pub fn first_client_deadline(&self) -> Option<Instant> {
        self.deadline.filter(|_| !self.had_client)
    }

    pub fn deadline_passed(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }

    pub fn has_deadline(&self) -> bool {
        self.deadline.is_some()
    }

    pub fn clear_deadline(&mut self) {
        self.deadline = None;
    }
}

impl Monitor {
    pub(super) fn on_attach(&mut self, id: u64, flags: PollFlags) {
        let input = self.attach.on_ready(id, flags);
        if !input.stdin.is_empty() {
            self.io.write_stdin(&input.stdin);
        }
        if input.closed_stdin {
            self.io.client_stdin_closed();
        }
        if let Some((w, h)) = input.resize {
            let _ = self.io.resize(w, h);
        }
    }

    pub(super) fn drop_dead_attach_clients(&mut self) {
        let dead = self.attach.take_dead();
        if dead.is_empty() {
            return;
        }
        self.trim_soon();
        for left_with_stdin in dead {
            if left_with_stdin {
                self.io.client_stdin_closed();
            }
        }
        if self.mode == Mode::Exec
            && self.attach.is_empty()
            && self.exit.is_none()
            && self.reaped.is_none()
        {
            // As containerd: the exec stream is gone, so is the process.
            eprintln!("crust-shim: last client detached, killing the exec process");
            let _ = crust_linux::process::send_signal(self.pid, libc::SIGKILL);
        }
    }

    /// When the loop must wake up for the exec session's first-client
    /// deadline.
    pub(super) fn attach_deadline(&self) -> Option<Instant> {
        if self.mode == Mode::Exec && self.exit.is_none() {
            self.attach.first_client_deadline()
        } else {
            None
        }
    }
}
