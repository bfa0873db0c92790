//! A SPDY/3.1 server session over any byte stream: one driver task owns the
//! socket, streams are handles implementing `AsyncRead` + `AsyncWrite`.
//!
//! Flow control. SPDY/3.1 gives every stream and the session a 64 KiB send
//! window that the receiver reopens with WINDOW_UPDATE. The Go clients that
//! matter here (client-go's spdystream, used by kubelet, crictl and critest)
//! never send WINDOW_UPDATE and never look at one: they rely on TCP
//! back-pressure. So this session
//! - always reopens the windows it advertised (stream windows as the reader
//!   consumes, the session window as data is buffered), so a peer that
//!   honours flow control (spdy-transport, browsers) never stalls;
//! - honours the peer's windows only once the peer has shown it speaks flow
//!   control (a SETTINGS or WINDOW_UPDATE frame); before that it sends like
//!   spdystream does;
//! - bounds what it buffers per stream: when a stream's buffer is full it
//!   stops reading the socket until the stream's reader catches up, which
//!   is the back-pressure spdystream peers expect.
//!
//! Everything a peer can make this side hold is bounded: control frame and
//! header block sizes, concurrent streams, per-stream buffers, queued
//! control replies (a peer that floods PINGs without reading is dropped).

use std::collections::{HashMap, VecDeque};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;

use super::frame::{self, Frame, FrameDecoder, goaway, rst, setting};
use super::headers::{self, HeaderDecoder, HeaderEncoder, Headers};

/// The window every stream and the session start with (SPDY/3.1).
pub const INITIAL_WINDOW: i64 = 64 * 1024;
/// DATA frames this side sends carry at most this much.
const MAX_DATA_CHUNK: usize = 32 * 1024;
/// Data queued for the socket beyond which writers wait.
const MAX_QUEUED_DATA: usize = 256 * 1024;
/// Control frames queued for a peer that does not read, beyond which the
/// session is dropped.
const MAX_QUEUED_CONTROL: usize = 1024;
const READ_CHUNK: usize = 64 * 1024;
const WRITE_HIGH: usize = 64 * 1024;

/// Limits and timeouts of one session.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Streams open at once; more are refused (REFUSED_STREAM).
    pub max_concurrent_streams: usize,
    /// Largest control frame payload (so largest compressed header block).
    pub max_control_frame: usize,
    /// Largest decompressed header block.
    pub max_header_block: usize,
    /// Bytes buffered for one stream before reading the socket pauses.
    pub stream_buffer: usize,
    /// A session with no traffic for this long is closed.
    pub idle_timeout: Duration,
    /// After a graceful close has flushed everything, how long to wait for
    /// the peer to hang up before dropping the connection.
    pub close_linger: Duration,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            max_concurrent_streams: 256,
            max_control_frame: 64 * 1024,
            max_header_block: 64 * 1024,
            stream_buffer: 256 * 1024,
            idle_timeout: Duration::from_secs(4 * 3600),
            close_linger: Duration::from_secs(30),
        }
    }
}

enum Out {
    Frame(Frame),
    Reply {
        stream_id: u32,
    },
    Data {
        stream_id: u32,
        fin: bool,
        data: Bytes,
    },
}

struct StreamState {
    recv: VecDeque<Bytes>,
    recv_len: usize,
    remote_fin: bool,
    local_fin: bool,
    reset: bool,
    replied: bool,
    send_window: i64,
    recv_unacked: u32,
    read_waker: Option<Waker>,
    write_waker: Option<Waker>,
    handles: usize,
}

impl StreamState {
    fn wake(&mut self) {
        if let Some(w) = self.read_waker.take() {
            w.wake();
        }
        if let Some(w) = self.write_waker.take() {
            w.wake();
        }
    }
}

struct State {
    streams: HashMap<u32, StreamState>,
    last_remote_id: u32,
    outq: VecDeque<Out>,
    queued_data: usize,
    queued_control: usize,
    dead: bool,
    closing: bool,
    peer_flow_control: bool,
    initial_send_window: i64,
    session_send_window: i64,
    session_recv_unacked: u32,
    blocked_writers: Vec<Waker>,
    paused_on: Option<u32>,
}

impl State {
    fn push_control(&mut self, f: Frame) {
        self.queued_control += 1;
        self.outq.push_back(Out::Frame(f));
    }

    /// Queues a control frame the peer provoked; too many unsent ones mean
    /// the peer sends without reading.
    fn push_reply(&mut self, f: Frame) -> Result<(), SessionError> {
        if self.queued_control >= MAX_QUEUED_CONTROL {
            return Err(SessionError::internal(
                "peer does not read its control frames",
            ));
        }
        self.push_control(f);
        Ok(())
    }

    fn wake_writers(&mut self) {
        for w in self.blocked_writers.drain(..) {
            w.wake();
        }
    }

    fn kill(&mut self) {
        self.dead = true;
        self.paused_on = None;
        for s in self.streams.values_mut() {
            s.wake();
        }
        self.wake_writers();
    }
}

struct Shared {
    state: Mutex<State>,
    driver: Notify,
    closed: watch::Sender<bool>,
    cfg: SessionConfig,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock would be a bug in this file; the
        // state stays usable enough to shut down.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A session error: the session ends with a GOAWAY carrying `status`.
#[derive(Debug)]
struct SessionError {
    status: u32,
    why: String,
}

impl SessionError {
    fn protocol(why: impl Into<String>) -> Self {
        SessionError {
            status: goaway::PROTOCOL_ERROR,
            why: why.into(),
        }
    }
    fn internal(why: impl Into<String>) -> Self {
        SessionError {
            status: goaway::INTERNAL_ERROR,
            why: why.into(),
        }
    }
}

/// Resolves once the flag is set (or its sender is gone).
pub(crate) async fn wait_closed(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|c| *c).await.is_ok();
}

/// The server end of a SPDY session. Dropping it closes the session
/// gracefully (GOAWAY, flush, hang up).
pub struct Session {
    shared: Arc<Shared>,
    incoming: mpsc::Receiver<SpdyStream>,
    closed: watch::Receiver<bool>,
}

impl Session {
    /// Starts serving `io` (after the HTTP upgrade, or inside a WebSocket
    /// tunnel) on a spawned driver task.
    pub fn start<T>(io: T, cfg: SessionConfig) -> Session
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (closed_tx, closed_rx) = watch::channel(false);
        let (in_tx, in_rx) = mpsc::channel(cfg.max_concurrent_streams.max(1));
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                streams: HashMap::new(),
                last_remote_id: 0,
                outq: VecDeque::new(),
                queued_data: 0,
                queued_control: 0,
                dead: false,
                closing: false,
                peer_flow_control: false,
                initial_send_window: INITIAL_WINDOW,
                session_send_window: INITIAL_WINDOW,
                session_recv_unacked: 0,
                blocked_writers: Vec::new(),
                paused_on: None,
            }),
            driver: Notify::new(),
            closed: closed_tx,
            cfg,
        });
        tokio::spawn(drive(shared.clone(), io, in_tx));
        Session {
            shared,
            incoming: in_rx,
            closed: closed_rx,
        }
    }

    /// The next stream the peer opened, not yet replied to; `None` once the
    /// session is over.
    pub async fn accept(&mut self) -> Option<SpdyStream> {
        tokio::select! {
            s = self.incoming.recv() => s,
            _ = wait_closed(self.closed.clone()) => None,
        }
    }

    /// Resolves when the connection is gone (peer hung up, error, or the
    /// end of a graceful close).
    pub async fn closed(&self) {
        wait_closed(self.closed.clone()).await
    }

    pub fn is_closed(&self) -> bool {
        *self.closed.borrow()
    }

    /// Starts a graceful close: GOAWAY after everything already queued,
    /// then the peer gets [`SessionConfig::close_linger`] to hang up.
    pub fn close(&self) {
        let mut st = self.shared.lock();
        if !st.closing && !st.dead {
            st.closing = true;
            let last = st.last_remote_id;
            st.push_control(Frame::GoAway {
                last_good_stream_id: last,
                status: goaway::OK,
            });
        }
        drop(st);
        self.shared.driver.notify_one();
    }

    /// [`Session::close`], then waits for the connection to be gone.
    pub async fn shutdown(&self) {
        self.close();
        self.closed().await;
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.close();
    }
}

/// One stream of a session. Several handles may exist for one stream
/// ([`SpdyStream::handle`]); the stream is reset (CANCEL) when the last is
/// dropped before this side finished sending.
pub struct SpdyStream {
    shared: Arc<Shared>,
    id: u32,
    headers: Arc<Headers>,
}

impl std::fmt::Debug for SpdyStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpdyStream")
            .field("id", &self.id)
            .field("headers", &self.headers)
            .finish()
    }
}

impl SpdyStream {
    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// A header of the SYN_STREAM, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        headers::get(&self.headers, name)
    }

    /// Sends SYN_REPLY (`:status: 200`), accepting the stream. Writing also
    /// replies first if this was not called.
    pub fn reply(&self) {
        let mut st = self.shared.lock();
        if let Some(s) = st.streams.get_mut(&self.id)
            && !s.replied
            && !s.reset
        {
            s.replied = true;
            st.outq.push_back(Out::Reply { stream_id: self.id });
        }
        drop(st);
        self.shared.driver.notify_one();
    }

    /// Resets the stream with a RST_STREAM status (see [`frame::rst`]).
    pub fn reset(&self, status: u32) {
        let mut st = self.shared.lock();
        if let Some(s) = st.streams.get_mut(&self.id)
            && !s.reset
        {
            s.reset = true;
            s.wake();
            st.push_control(Frame::RstStream {
                stream_id: self.id,
                status,
            });
            if st.paused_on == Some(self.id) {
                st.paused_on = None;
            }
        }
        drop(st);
        self.shared.driver.notify_one();
    }

    /// Another handle to the same stream.
    pub fn handle(&self) -> SpdyStream {
        let mut st = self.shared.lock();
        if let Some(s) = st.streams.get_mut(&self.id) {
            s.handles += 1;
        }
        SpdyStream {
            shared: self.shared.clone(),
            id: self.id,
            headers: self.headers.clone(),
        }
    }

    /// Whether the peer has finished sending (FIN or reset).
    pub fn is_remote_closed(&self) -> bool {
        let st = self.shared.lock();
        st.streams
            .get(&self.id)
            .is_none_or(|s| s.remote_fin || s.reset)
            || st.dead
    }
}

impl Drop for SpdyStream {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        let Some(s) = st.streams.get_mut(&self.id) else {
            return;
        };
        s.handles = s.handles.saturating_sub(1);
        if s.handles > 0 {
            return;
        }
        let cancel = !s.reset && !s.local_fin && !st.dead;
        st.streams.remove(&self.id);
        if st.paused_on == Some(self.id) {
            st.paused_on = None;
        }
        if cancel {
            st.push_control(Frame::RstStream {
                stream_id: self.id,
                status: rst::CANCEL,
            });
        }
        drop(st);
        self.shared.driver.notify_one();
    }
}

impl AsyncRead for SpdyStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let stream_buffer = this.shared.cfg.stream_buffer;
        let mut st = this.shared.lock();
        let st = &mut *st;
        let Some(s) = st.streams.get_mut(&this.id) else {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "stream is gone",
            )));
        };
        if let Some(front) = s.recv.front_mut() {
            let n = front.len().min(buf.remaining());
            buf.put_slice(&front[..n]);
            front.advance(n);
            if front.is_empty() {
                s.recv.pop_front();
            }
            s.recv_len -= n;
            s.recv_unacked += n as u32;
            let mut notify = false;
            let ack = (s.recv_unacked as i64 >= INITIAL_WINDOW / 2
                && !s.remote_fin
                && !s.reset
                && !st.dead)
                .then(|| std::mem::take(&mut s.recv_unacked));
            let drained = s.recv_len < stream_buffer / 2;
            if let Some(delta) = ack {
                st.push_control(Frame::WindowUpdate {
                    stream_id: this.id,
                    delta,
                });
                notify = true;
            }
            if st.paused_on == Some(this.id) && drained {
                st.paused_on = None;
                notify = true;
            }
            if notify {
                this.shared.driver.notify_one();
            }
            return Poll::Ready(Ok(()));
        }
        if s.reset {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "stream reset",
            )));
        }
        if s.remote_fin {
            return Poll::Ready(Ok(()));
        }
        if st.dead {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "connection closed",
            )));
        }
        s.read_waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl AsyncWrite for SpdyStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let mut st = this.shared.lock();
        let st = &mut *st;
        if st.dead {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "connection closed",
            )));
        }
        let Some(s) = st.streams.get_mut(&this.id) else {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "stream is gone",
            )));
        };
        if s.reset {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "stream reset",
            )));
        }
        if s.local_fin {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "stream already finished",
            )));
        }
        if st.queued_data >= MAX_QUEUED_DATA {
            st.blocked_writers.push(cx.waker().clone());
            return Poll::Pending;
        }
        let mut n = buf.len().min(MAX_DATA_CHUNK);
        if st.peer_flow_control {
            let avail = s.send_window.min(st.session_send_window);
            if avail <= 0 {
                s.write_waker = Some(cx.waker().clone());
                st.blocked_writers.push(cx.waker().clone());
                return Poll::Pending;
            }
            n = n.min(avail as usize);
            s.send_window -= n as i64;
            st.session_send_window -= n as i64;
        }
        if !s.replied {
            s.replied = true;
            st.outq.push_back(Out::Reply { stream_id: this.id });
        }
        st.outq.push_back(Out::Data {
            stream_id: this.id,
            fin: false,
            data: Bytes::copy_from_slice(&buf[..n]),
        });
        st.queued_data += n;
        this.shared.driver.notify_one();
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Sends FIN: this side is done sending on the stream.
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let mut st = this.shared.lock();
        let st = &mut *st;
        if let Some(s) = st.streams.get_mut(&this.id)
            && !s.local_fin
            && !s.reset
            && !st.dead
        {
            s.local_fin = true;
            if !s.replied {
                s.replied = true;
                st.outq.push_back(Out::Reply { stream_id: this.id });
            }
            st.outq.push_back(Out::Data {
                stream_id: this.id,
                fin: true,
                data: Bytes::new(),
            });
            this.shared.driver.notify_one();
        }
        Poll::Ready(Ok(()))
    }
}

async fn drive<T>(shared: Arc<Shared>, io: T, incoming: mpsc::Sender<SpdyStream>)
where
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    let cfg = shared.cfg.clone();
    let (mut rd, mut wr) = tokio::io::split(io);
    let mut rbuf = BytesMut::with_capacity(READ_CHUNK);
    let mut wbuf = BytesMut::with_capacity(WRITE_HIGH + MAX_DATA_CHUNK + 64);
    let mut decoder = FrameDecoder::new(cfg.max_control_frame);
    let mut hdec = HeaderDecoder::new(cfg.max_header_block);
    let mut henc = HeaderEncoder::new();
    let mut scratch = Vec::new();
    // Set after a session error: stop reading, flush the GOAWAY, hang up.
    let mut stop_reading = false;
    let mut linger_until: Option<Instant> = None;
    let mut idle_until = Instant::now() + cfg.idle_timeout;

    let outcome: Result<(), String> = loop {
        let (can_read, closing, outq_empty) = {
            let mut st = shared.lock();
            if st.dead {
                break Ok(());
            }
            fill(&mut st, &mut wbuf, &mut henc, &mut scratch);
            (st.paused_on.is_none(), st.closing, st.outq.is_empty())
        };
        let flushed = outq_empty && wbuf.is_empty();
        if stop_reading && flushed {
            break Ok(());
        }
        if closing && flushed && linger_until.is_none() {
            // Everything is out, GOAWAY last. The peer hangs up once it has
            // read it all; shutting the socket first would race its reading
            // (spdystream and spdy-transport both drop frames still queued
            // when the socket ends).
            linger_until = Some(Instant::now() + cfg.close_linger);
        }
        if rbuf.capacity() - rbuf.len() < 4096 {
            rbuf.reserve(READ_CHUNK);
        }
        let deadline = linger_until.map_or(idle_until, |l| l.min(idle_until));
        tokio::select! {
            r = rd.read_buf(&mut rbuf), if can_read && !stop_reading => match r {
                Ok(0) => break Ok(()),
                Ok(_) => {
                    idle_until = Instant::now() + cfg.idle_timeout;
                    let (new_streams, err) = process(&shared, &mut decoder, &mut hdec, &mut rbuf);
                    for s in new_streams {
                        if let Err(e) = incoming.try_send(s) {
                            let s = match e {
                                mpsc::error::TrySendError::Full(s) | mpsc::error::TrySendError::Closed(s) => s,
                            };
                            s.reset(rst::REFUSED_STREAM);
                        }
                    }
                    if let Some(e) = err {
                        tracing::debug!(status = e.status, "SPDY session error: {}", e.why);
                        let mut st = shared.lock();
                        if !st.closing {
                            st.closing = true;
                            let last = st.last_remote_id;
                            st.push_control(Frame::GoAway { last_good_stream_id: last, status: e.status });
                        }
                        stop_reading = true;
                        // Writes get a bounded time to carry the GOAWAY out.
                        linger_until = Some(Instant::now() + Duration::from_secs(2));
                    }
                }
                Err(e) => break Err(e.to_string()),
            },
            r = wr.write(&wbuf), if !wbuf.is_empty() => match r {
                Ok(0) => break Err("socket closed".into()),
                Ok(n) => {
                    wbuf.advance(n);
                    idle_until = Instant::now() + cfg.idle_timeout;
                }
                Err(e) => break Err(e.to_string()),
            },
            _ = shared.driver.notified() => {}
            _ = tokio::time::sleep_until(deadline) => {
                if linger_until.is_some_and(|l| Instant::now() >= l) {
                    break Ok(());
                }
                if Instant::now() >= idle_until {
                    break Err("idle timeout".into());
                }
            }
        }
    };
    if let Err(e) = &outcome {
        tracing::debug!("SPDY session ended: {e}");
    }
    shared.lock().kill();
    shared.closed.send_replace(true);
}

/// Moves queued frames into the write buffer.
fn fill(st: &mut State, wbuf: &mut BytesMut, henc: &mut HeaderEncoder, scratch: &mut Vec<u8>) {
    while wbuf.len() < WRITE_HIGH {
        let Some(out) = st.outq.pop_front() else {
            break;
        };
        match out {
            Out::Frame(f) => {
                st.queued_control -= 1;
                f.encode(wbuf);
            }
            Out::Reply { stream_id } => {
                scratch.clear();
                // Go's spdystream ignores reply headers; SPDY/3 HTTP peers
                // (spdy-transport) insist on a status.
                henc.encode(&[(":status", "200"), (":version", "HTTP/1.1")], scratch);
                Frame::SynReply {
                    stream_id,
                    flags: 0,
                    header_block: Bytes::copy_from_slice(scratch),
                }
                .encode(wbuf);
            }
            Out::Data {
                stream_id,
                fin,
                data,
            } => {
                st.queued_data -= data.len();
                frame::encode_data_header(
                    stream_id,
                    if fin { frame::FLAG_FIN } else { 0 },
                    data.len(),
                    wbuf,
                );
                wbuf.extend_from_slice(&data);
            }
        }
    }
    if st.queued_data < MAX_QUEUED_DATA / 2 && !st.blocked_writers.is_empty() {
        st.wake_writers();
    }
}

/// Decodes and handles every complete frame in `rbuf`.
fn process(
    shared: &Arc<Shared>,
    decoder: &mut FrameDecoder,
    hdec: &mut HeaderDecoder,
    rbuf: &mut BytesMut,
) -> (Vec<SpdyStream>, Option<SessionError>) {
    let mut new_streams = Vec::new();
    let mut st = shared.lock();
    loop {
        let frame = match decoder.decode(rbuf) {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                let status = match e {
                    frame::FrameError::TooLarge { .. } => goaway::INTERNAL_ERROR,
                    _ => goaway::PROTOCOL_ERROR,
                };
                drop(st);
                return (
                    new_streams,
                    Some(SessionError {
                        status,
                        why: e.to_string(),
                    }),
                );
            }
        };
        if let Err(e) = handle(shared, &mut st, hdec, frame, &mut new_streams) {
            drop(st);
            return (new_streams, Some(e));
        }
    }
    drop(st);
    (new_streams, None)
}

fn handle(
    shared: &Arc<Shared>,
    st: &mut State,
    hdec: &mut HeaderDecoder,
    frame: Frame,
    new_streams: &mut Vec<SpdyStream>,
) -> Result<(), SessionError> {
    let cfg = &shared.cfg;
    match frame {
        Frame::Data {
            stream_id,
            flags,
            data,
        } => {
            if stream_id == 0 {
                return Err(SessionError::protocol("DATA on stream 0"));
            }
            let n = data.len();
            // The session window is reopened as data arrives; per-stream
            // buffers bound what that lets in.
            st.session_recv_unacked += n as u32;
            if st.session_recv_unacked as i64 >= INITIAL_WINDOW / 2 {
                let delta = std::mem::take(&mut st.session_recv_unacked);
                st.push_control(Frame::WindowUpdate {
                    stream_id: 0,
                    delta,
                });
            }
            let fin = flags & frame::FLAG_FIN != 0;
            match st.streams.get_mut(&stream_id) {
                Some(s) if s.reset => {}
                Some(s) if s.remote_fin => {
                    s.reset = true;
                    s.wake();
                    st.push_reply(Frame::RstStream {
                        stream_id,
                        status: rst::STREAM_ALREADY_CLOSED,
                    })?;
                }
                Some(s) => {
                    if n > 0 {
                        s.recv.push_back(data);
                        s.recv_len += n;
                    }
                    if fin {
                        s.remote_fin = true;
                    }
                    let full = s.recv_len >= cfg.stream_buffer;
                    s.wake();
                    if full && st.paused_on.is_none() {
                        st.paused_on = Some(stream_id);
                    }
                }
                None => {
                    if stream_id > st.last_remote_id || stream_id % 2 == 0 {
                        st.push_reply(Frame::RstStream {
                            stream_id,
                            status: rst::INVALID_STREAM,
                        })?;
                    }
                    // Otherwise: a stream this side already let go of.
                }
            }
        }
        Frame::SynStream {
            stream_id,
            flags,
            header_block,
            ..
        } => {
            let headers = match hdec.decode(&header_block) {
                Ok(h) => Ok(h),
                Err(e) if e.is_session_error() => {
                    return Err(SessionError::protocol(e.to_string()));
                }
                Err(e) => Err(e),
            };
            if stream_id % 2 == 0 || stream_id <= st.last_remote_id {
                return Err(SessionError::protocol(format!(
                    "SYN_STREAM with stream id {stream_id} out of order"
                )));
            }
            st.last_remote_id = stream_id;
            let headers = match headers {
                Ok(h) => h,
                Err(e) => {
                    tracing::debug!(stream_id, "refusing stream: {e}");
                    st.push_reply(Frame::RstStream {
                        stream_id,
                        status: rst::PROTOCOL_ERROR,
                    })?;
                    return Ok(());
                }
            };
            if st.closing || st.streams.len() >= cfg.max_concurrent_streams {
                st.push_reply(Frame::RstStream {
                    stream_id,
                    status: rst::REFUSED_STREAM,
                })?;
                return Ok(());
            }
            st.streams.insert(
                stream_id,
                StreamState {
                    recv: VecDeque::new(),
                    recv_len: 0,
                    remote_fin: flags & frame::FLAG_FIN != 0,
                    local_fin: flags & frame::FLAG_UNIDIRECTIONAL != 0,
                    reset: false,
                    replied: false,
                    send_window: st.initial_send_window,
                    recv_unacked: 0,
                    read_waker: None,
                    write_waker: None,
                    handles: 1,
                },
            );
            new_streams.push(SpdyStream {
                shared: shared.clone(),
                id: stream_id,
                headers: Arc::new(headers),
            });
        }
        Frame::SynReply {
            stream_id,
            header_block,
            ..
        } => {
            // This side opens no streams; keep the zlib context in step.
            if let Err(e) = hdec.decode(&header_block)
                && e.is_session_error()
            {
                return Err(SessionError::protocol(e.to_string()));
            }
            st.push_reply(Frame::RstStream {
                stream_id,
                status: rst::PROTOCOL_ERROR,
            })?;
        }
        Frame::Headers {
            stream_id,
            flags,
            header_block,
        } => {
            if let Err(e) = hdec.decode(&header_block)
                && e.is_session_error()
            {
                return Err(SessionError::protocol(e.to_string()));
            }
            if flags & frame::FLAG_FIN != 0
                && let Some(s) = st.streams.get_mut(&stream_id)
            {
                s.remote_fin = true;
                s.wake();
            }
        }
        Frame::RstStream { stream_id, .. } => {
            if let Some(s) = st.streams.get_mut(&stream_id) {
                s.reset = true;
                s.wake();
                if st.paused_on == Some(stream_id) {
                    st.paused_on = None;
                }
            }
        }
        Frame::Settings { entries, .. } => {
            for e in entries {
                if e.id == setting::INITIAL_WINDOW_SIZE {
                    if e.value > frame::MAX_31_BIT {
                        return Err(SessionError::protocol("INITIAL_WINDOW_SIZE beyond 2^31-1"));
                    }
                    let delta = i64::from(e.value) - st.initial_send_window;
                    st.initial_send_window = i64::from(e.value);
                    for s in st.streams.values_mut() {
                        s.send_window += delta;
                        s.wake();
                    }
                }
            }
            st.peer_flow_control = true;
            st.wake_writers();
        }
        Frame::Ping { id } => {
            // Odd ids are the client's; even ones would answer pings of
            // ours, and this side sends none.
            if id % 2 == 1 {
                st.push_reply(Frame::Ping { id })?;
            }
        }
        Frame::GoAway { .. } => {
            // The peer opens no more streams; the open ones carry on.
        }
        Frame::WindowUpdate { stream_id, delta } => {
            st.peer_flow_control = true;
            if stream_id == 0 {
                if delta == 0 {
                    return Err(SessionError::protocol("session WINDOW_UPDATE of 0"));
                }
                st.session_send_window =
                    (st.session_send_window + i64::from(delta)).min(i64::from(frame::MAX_31_BIT));
                st.wake_writers();
            } else if let Some(s) = st.streams.get_mut(&stream_id) {
                let w = s.send_window + i64::from(delta);
                if delta == 0 || w > i64::from(frame::MAX_31_BIT) {
                    s.reset = true;
                    s.wake();
                    st.push_reply(Frame::RstStream {
                        stream_id,
                        status: rst::FLOW_CONTROL_ERROR,
                    })?;
                } else {
                    s.send_window = w;
                    s.wake();
                    st.wake_writers();
                }
            }
        }
        Frame::Unknown { frame_type, .. } => {
            tracing::trace!(frame_type, "ignoring unknown SPDY control frame");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spdy::frame::{self, Setting};
    use crate::spdy::tests_support::XorShift;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static PANICS: AtomicUsize = AtomicUsize::new(0);

    /// A random but mostly well-formed frame, so the session logic (not
    /// only the decoder) sees every kind of frame in every state.
    fn random_frame(rng: &mut XorShift, enc: &mut HeaderEncoder, out: &mut BytesMut) {
        let id = (rng.next() % 12) as u32;
        let flags = (rng.next() % 4) as u8;
        let f = match rng.next() % 12 {
            0..=2 => {
                let block = {
                    let mut b = Vec::new();
                    let st = ["error", "data", "stdin", "bogus"][(rng.next() % 4) as usize];
                    enc.encode(&[("streamtype", st), ("port", "80")], &mut b);
                    b
                };
                Frame::SynStream {
                    stream_id: id,
                    associated_stream_id: 0,
                    priority: 0,
                    slot: 0,
                    flags,
                    header_block: block.into(),
                }
            }
            3..=5 => Frame::Data {
                stream_id: id,
                flags: flags & frame::FLAG_FIN,
                data: Bytes::from(vec![1u8; (rng.next() % 40_000) as usize]),
            },
            6 => Frame::RstStream {
                stream_id: id.max(1),
                status: (rng.next() % 12) as u32,
            },
            7 => Frame::WindowUpdate {
                stream_id: id,
                delta: (rng.next() as u32) & frame::MAX_31_BIT,
            },
            8 => Frame::Settings {
                flags: 0,
                entries: vec![Setting {
                    flags: 0,
                    id: setting::INITIAL_WINDOW_SIZE,
                    value: rng.next() as u32,
                }],
            },
            9 => Frame::Ping {
                id: rng.next() as u32,
            },
            10 => Frame::Headers {
                stream_id: id.max(1),
                flags,
                header_block: Bytes::from_static(b"\x00"),
            },
            _ => Frame::GoAway {
                last_good_stream_id: id,
                status: 0,
            },
        };
        f.encode(out);
    }

    #[tokio::test]
    async fn random_frame_sequences_never_panic_the_session() {
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default_hook(info);
        }));
        let mut rng = XorShift(0xfeed_f00d);
        for _ in 0..300 {
            let (client, server) = tokio::io::duplex(1 << 20);
            let cfg = SessionConfig {
                stream_buffer: 64 * 1024,
                ..SessionConfig::default()
            };
            let mut session = Session::start(server, cfg);
            // Accept streams, read and write a little on each.
            let worker = tokio::spawn(async move {
                let mut n = 0u64;
                while let Some(mut s) = session.accept().await {
                    n += 1;
                    if n.is_multiple_of(3) {
                        s.reset(rst::CANCEL);
                        continue;
                    }
                    s.reply();
                    tokio::spawn(async move {
                        let mut buf = [0u8; 4096];
                        let _ =
                            tokio::time::timeout(Duration::from_millis(20), s.read(&mut buf)).await;
                        let _ = tokio::time::timeout(
                            Duration::from_millis(20),
                            s.write_all(&[7u8; 70_000]),
                        )
                        .await;
                        let _ = s.shutdown().await;
                    });
                }
                session.close();
            });
            let mut enc = HeaderEncoder::new();
            let mut wire = BytesMut::new();
            for _ in 0..(rng.next() % 30) {
                random_frame(&mut rng, &mut enc, &mut wire);
            }
            if rng.next().is_multiple_of(4) {
                // Some raw garbage at the end.
                wire.extend((0..(rng.next() % 64)).map(|_| rng.next() as u8));
            }
            let (mut rd, mut wr) = tokio::io::split(client);
            let drain = tokio::spawn(async move {
                let mut sink = [0u8; 65536];
                while matches!(rd.read(&mut sink).await, Ok(n) if n > 0) {}
            });
            let _ = tokio::time::timeout(Duration::from_secs(2), wr.write_all(&wire)).await;
            let _ = wr.shutdown().await;
            let _ = tokio::time::timeout(Duration::from_secs(5), worker).await;
            drain.abort();
        }
        assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a session task panicked");
    }
}
