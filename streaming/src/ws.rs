//! The Kubernetes WebSocket channel protocols (`*.channel.k8s.io`): every
//! message starts with a channel number; `base64.*` variants send text
//! messages with the channel as an ASCII digit and base64 payloads; v5 adds
//! a close signal (`[255, channel]`) so one side can end a channel without
//! ending the connection. Also the byte-stream view of a WebSocket that the
//! SPDY-over-WebSocket port-forward tunnel needs.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use base64::Engine;
use bytes::{Buf, Bytes};
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use hyper_tungstenite::HyperWebsocketStream;
use hyper_tungstenite::tungstenite::Message;
use hyper_tungstenite::tungstenite::protocol::CloseFrame;
use hyper_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::PollSender;

use crate::spdy::session::wait_closed;

/// The v5 close signal's marker byte.
pub(crate) const CLOSE_SIGNAL: u8 = 255;
/// Largest payload one outgoing channel message carries.
const MAX_MESSAGE_PAYLOAD: usize = 32 * 1024;

/// How channel messages are framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Codec {
    Binary,
    Base64,
}

/// A negotiated channel protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChannelProtocol {
    pub codec: Codec,
    /// v4 and v5 carry JSON statuses on the error channel.
    pub v4_status: bool,
    /// v5: the close signal.
    pub close_signal: bool,
}

/// Picks the first of the client's WebSocket subprotocols this side speaks
/// (the client's preference wins, as kubelet does). `Ok(None)`: the client
/// offered none, which means the legacy binary protocol.
pub(crate) fn negotiate<'a>(
    offered: &[&'a str],
    supported: &[&'static str],
) -> Result<Option<&'a str>, ()> {
    if offered.is_empty() {
        return Ok(None);
    }
    offered
        .iter()
        .find(|p| supported.contains(p))
        .copied()
        .map(Some)
        .ok_or(())
}

pub(crate) fn protocol_of(name: Option<&str>) -> ChannelProtocol {
    match name.unwrap_or("") {
        "v5.channel.k8s.io" => ChannelProtocol {
            codec: Codec::Binary,
            v4_status: true,
            close_signal: true,
        },
        "v4.channel.k8s.io" => ChannelProtocol {
            codec: Codec::Binary,
            v4_status: true,
            close_signal: false,
        },
        "v4.base64.channel.k8s.io" => ChannelProtocol {
            codec: Codec::Base64,
            v4_status: true,
            close_signal: false,
        },
        "base64.channel.k8s.io" => ChannelProtocol {
            codec: Codec::Base64,
            v4_status: false,
            close_signal: false,
        },
        _ => ChannelProtocol {
            codec: Codec::Binary,
            v4_status: false,
            close_signal: false,
        },
    }
}

/// The subprotocols of a request, in the client's order.
pub(crate) fn offered_protocols(headers: &hyper::HeaderMap) -> Vec<&str> {
    headers
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

pub(crate) fn ws_config() -> hyper_tungstenite::tungstenite::protocol::WebSocketConfig {
    hyper_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(1 << 20))
        .max_frame_size(Some(1 << 20))
}

fn encode(codec: Codec, channel: u8, data: &[u8]) -> Message {
    match codec {
        Codec::Binary => {
            let mut v = Vec::with_capacity(data.len() + 1);
            v.push(channel);
            v.extend_from_slice(data);
            Message::binary(v)
        }
        Codec::Base64 => {
            let mut s = String::with_capacity(2 + data.len().div_ceil(3) * 4);
            s.push(base64_channel_char(channel));
            base64::engine::general_purpose::STANDARD.encode_string(data, &mut s);
            Message::text(s)
        }
    }
}

/// The channel of a `base64.*` message: the char `'0' + channel`. Real
/// channels are single digits; a higher one is the char that far past
/// `'0'` (always a valid char, so never a panic or a wrapped channel).
fn base64_channel_char(channel: u8) -> char {
    char::from_u32(u32::from(b'0') + u32::from(channel)).expect("48..=303 are chars")
}

/// What one client message means for the channels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Incoming {
    /// Bytes for a channel (possibly none).
    Data(u8, Bytes),
    /// v5: the client is done sending on a channel.
    CloseChannel(u8),
    /// Nothing for anyone: empty, undecodable, a ping, or a message of the
    /// other codec.
    Skip,
    /// The client closes, or broke the protocol: stop reading.
    End,
}

/// Decodes one client message of a channel protocol.
pub(crate) fn decode(proto: ChannelProtocol, msg: Message) -> Incoming {
    match msg {
        Message::Binary(b) if proto.codec == Codec::Binary => {
            if b.is_empty() {
                return Incoming::Skip;
            }
            if proto.close_signal && b[0] == CLOSE_SIGNAL {
                if b.len() == 2 {
                    return Incoming::CloseChannel(b[1]);
                }
                tracing::debug!("malformed WebSocket close signal");
                return Incoming::End;
            }
            Incoming::Data(b[0], b.slice(1..))
        }
        Message::Text(t) if proto.codec == Codec::Base64 => {
            let mut chars = t.as_str().chars();
            let Some(first) = chars.next() else {
                return Incoming::Skip;
            };
            let Some(channel) = (first as u32)
                .checked_sub(u32::from(b'0'))
                .and_then(|c| u8::try_from(c).ok())
            else {
                return Incoming::Skip;
            };
            match base64::engine::general_purpose::STANDARD.decode(chars.as_str()) {
                Ok(v) => Incoming::Data(channel, Bytes::from(v)),
                Err(_) => {
                    tracing::debug!("undecodable base64 WebSocket message");
                    Incoming::Skip
                }
            }
        }
        Message::Close(_) => Incoming::End,
        _ => Incoming::Skip,
    }
}

/// Reads what the client sends on one channel.
pub(crate) struct ChannelReader {
    rx: mpsc::Receiver<Bytes>,
    cur: Bytes,
}

impl AsyncRead for ChannelReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if !self.cur.is_empty() {
                let n = self.cur.len().min(buf.remaining());
                buf.put_slice(&self.cur[..n]);
                self.cur.advance(n);
                return Poll::Ready(Ok(()));
            }
            match ready!(self.rx.poll_recv(cx)) {
                Some(b) => self.cur = b,
                None => return Poll::Ready(Ok(())),
            }
        }
    }
}

/// Sends on one channel. Shutting it down sends the v5 close signal (when
/// the protocol has one).
pub(crate) struct ChannelWriter {
    tx: PollSender<Message>,
    channel: u8,
    proto: ChannelProtocol,
    closed: bool,
}

impl ChannelWriter {
    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        msg: impl FnOnce() -> Message,
    ) -> Poll<io::Result<()>> {
        ready!(self.tx.poll_reserve(cx))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "connection closed"))?;
        self.tx
            .send_item(msg())
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "connection closed"))?;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for ChannelWriter {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.closed {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "channel closed",
            )));
        }
        let n = buf.len().min(MAX_MESSAGE_PAYLOAD);
        let (codec, channel) = (self.proto.codec, self.channel);
        ready!(self.poll_send(cx, || encode(codec, channel, &buf[..n])))?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.closed || !self.proto.close_signal {
            self.closed = true;
            return Poll::Ready(Ok(()));
        }
        let channel = self.channel;
        // A client that is gone needs no close signal.
        let _ = ready!(self.poll_send(cx, || Message::binary(vec![CLOSE_SIGNAL, channel])));
        self.closed = true;
        Poll::Ready(Ok(()))
    }
}

/// A channel both ways (port-forward data channels).
pub(crate) struct ChannelDuplex {
    pub reader: ChannelReader,
    pub writer: ChannelWriter,
}

impl AsyncRead for ChannelDuplex {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.reader).poll_read(cx, buf)
    }
}

impl AsyncWrite for ChannelDuplex {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.writer).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.writer).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.writer).poll_shutdown(cx)
    }
}

/// A WebSocket carrying channels: the reader task feeds the channels the
/// client writes to, writers queue messages for the writer task.
pub(crate) struct Channels {
    proto: ChannelProtocol,
    out: mpsc::Sender<Message>,
    readers: HashMap<u8, ChannelReader>,
    closed: watch::Receiver<bool>,
    done: Option<tokio::sync::oneshot::Sender<()>>,
    finished: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl Channels {
    /// Starts the reader and writer tasks. `inputs` are the channels the
    /// client may write to; messages for other channels are dropped.
    pub(crate) fn start(
        ws: HyperWebsocketStream,
        proto: ChannelProtocol,
        inputs: &[u8],
        linger: Duration,
    ) -> Self {
        let (sink, stream) = ws.split();
        let (out_tx, out_rx) = mpsc::channel::<Message>(16);
        let (closed_tx, closed_rx) = watch::channel(false);
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let (finished_tx, finished_rx) = tokio::sync::oneshot::channel();
        let mut senders = HashMap::new();
        let mut readers = HashMap::new();
        for &ch in inputs {
            let (tx, rx) = mpsc::channel(16);
            senders.insert(ch, tx);
            readers.insert(
                ch,
                ChannelReader {
                    rx,
                    cur: Bytes::new(),
                },
            );
        }
        let reader_closed = closed_tx.clone();
        let reader = tokio::spawn(read_loop(stream, senders, proto, reader_closed));
        tokio::spawn(async move {
            write_loop(sink, out_rx, done_rx, closed_tx.subscribe(), linger).await;
            // Give the client its close handshake, then make sure the
            // reader is gone too.
            let _ = tokio::time::timeout(linger, wait_closed(closed_tx.subscribe())).await;
            reader.abort();
            closed_tx.send_replace(true);
            let _ = finished_tx.send(());
        });
        Channels {
            proto,
            out: out_tx,
            readers,
            closed: closed_rx,
            done: Some(done_tx),
            finished: Some(finished_rx),
        }
    }

    /// The reader of an input channel (once).
    pub(crate) fn reader(&mut self, channel: u8) -> Option<ChannelReader> {
        self.readers.remove(&channel)
    }

    /// Drops the input channels nobody took: what the client sends on them
    /// is discarded instead of waiting for a reader.
    pub(crate) fn discard_untaken(&mut self) {
        self.readers.clear();
    }

    pub(crate) fn writer(&self, channel: u8) -> ChannelWriter {
        ChannelWriter {
            tx: PollSender::new(self.out.clone()),
            channel,
            proto: self.proto,
            closed: false,
        }
    }

    /// Sends one message on a channel.
    pub(crate) async fn send(&self, channel: u8, data: &[u8]) -> bool {
        self.out
            .send(encode(self.proto.codec, channel, data))
            .await
            .is_ok()
    }

    /// Resolves when the client is gone.
    pub(crate) async fn closed(&self) {
        wait_closed(self.closed.clone()).await
    }

    /// Sends what is queued, then a normal close, and waits (bounded) for
    /// the client to answer it.
    pub(crate) async fn close(mut self) {
        if let Some(done) = self.done.take() {
            let _ = done.send(());
        }
        drop(self.out);
        if let Some(f) = self.finished.take() {
            let _ = f.await;
        }
    }
}

async fn read_loop(
    mut stream: futures_util::stream::SplitStream<HyperWebsocketStream>,
    mut senders: HashMap<u8, mpsc::Sender<Bytes>>,
    proto: ChannelProtocol,
    closed: watch::Sender<bool>,
) {
    while let Some(msg) = stream.next().await {
        let Ok(msg) = msg else { break };
        let (channel, payload) = match decode(proto, msg) {
            Incoming::Data(channel, payload) => (channel, payload),
            Incoming::CloseChannel(channel) => {
                // EOF for whoever reads the channel.
                senders.remove(&channel);
                continue;
            }
            Incoming::Skip => continue,
            Incoming::End => break,
        };
        if let Some(tx) = senders.get(&channel) {
            if payload.is_empty() {
                continue;
            }
            if tx.send(payload).await.is_err() {
                // Nobody reads the channel any more: drop its input.
                senders.remove(&channel);
            }
        }
    }
    drop(senders);
    closed.send_replace(true);
}

async fn write_loop(
    mut sink: futures_util::stream::SplitSink<HyperWebsocketStream, Message>,
    mut out: mpsc::Receiver<Message>,
    mut done: tokio::sync::oneshot::Receiver<()>,
    closed: watch::Receiver<bool>,
    linger: Duration,
) {
    loop {
        tokio::select! {
            biased;
            m = out.recv() => match m {
                Some(m) => {
                    if sink.feed(m).await.is_err() {
                        return;
                    }
                    // Flush when nothing else is queued.
                    if out.is_empty() && sink.flush().await.is_err() {
                        return;
                    }
                }
                None => break,
            },
            _ = &mut done => {
                // Whatever was queued before the close goes out first.
                while let Ok(m) = out.try_recv() {
                    if sink.feed(m).await.is_err() {
                        return;
                    }
                }
                break;
            }
            _ = wait_closed(closed.clone()) => return,
        }
    }
    let close = Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    }));
    let _ = tokio::time::timeout(linger, async {
        let _ = sink.send(close).await;
        let _ = sink.flush().await;
    })
    .await;
}

/// A WebSocket as a byte stream: each binary message is the next piece of
/// the stream (the SPDY/3.1 tunnel of `SPDY/3.1+portforward.k8s.io`).
pub(crate) struct WsBytes {
    ws: HyperWebsocketStream,
    cur: Bytes,
    eof: bool,
}

impl WsBytes {
    pub(crate) fn new(ws: HyperWebsocketStream) -> Self {
        WsBytes {
            ws,
            cur: Bytes::new(),
            eof: false,
        }
    }
}

fn ws_err(e: hyper_tungstenite::tungstenite::Error) -> io::Error {
    io::Error::other(e)
}

impl AsyncRead for WsBytes {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            if !self.cur.is_empty() {
                let n = self.cur.len().min(buf.remaining());
                buf.put_slice(&self.cur[..n]);
                self.cur.advance(n);
                return Poll::Ready(Ok(()));
            }
            if self.eof {
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut self.ws).poll_next(cx)) {
                Some(Ok(Message::Binary(b))) => self.cur = b,
                Some(Ok(Message::Close(_))) | None => self.eof = true,
                Some(Ok(Message::Text(_))) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "text message in a binary tunnel",
                    )));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Poll::Ready(Err(ws_err(e))),
            }
        }
    }
}

impl AsyncWrite for WsBytes {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(Pin::new(&mut self.ws).poll_ready(cx)).map_err(ws_err)?;
        let n = buf.len().min(64 * 1024);
        Pin::new(&mut self.ws)
            .start_send(Message::binary(buf[..n].to_vec()))
            .map_err(ws_err)?;
        // tungstenite buffers; push it out so a lone frame is not held back.
        match Pin::new(&mut self.ws).poll_flush(cx) {
            Poll::Ready(Err(e)) => return Poll::Ready(Err(ws_err(e))),
            Poll::Ready(Ok(())) | Poll::Pending => {}
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.ws).poll_flush(cx).map_err(ws_err)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match ready!(Pin::new(&mut self.ws).poll_close(cx)) {
            Ok(()) => Poll::Ready(Ok(())),
            Err(hyper_tungstenite::tungstenite::Error::ConnectionClosed) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(ws_err(e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn negotiation_follows_the_client() {
        let ours = ["v5.channel.k8s.io", "v4.channel.k8s.io", "channel.k8s.io"];
        assert_eq!(
            negotiate(&["v4.channel.k8s.io", "v5.channel.k8s.io"], &ours),
            Ok(Some("v4.channel.k8s.io"))
        );
        assert_eq!(
            negotiate(&["x", "v5.channel.k8s.io"], &ours),
            Ok(Some("v5.channel.k8s.io"))
        );
        assert_eq!(negotiate(&[], &ours), Ok(None));
        assert_eq!(negotiate(&["x"], &ours), Err(()));
    }

    const PROTOCOLS: [&str; 5] = [
        "v5.channel.k8s.io",
        "v4.channel.k8s.io",
        "v4.base64.channel.k8s.io",
        "channel.k8s.io",
        "base64.channel.k8s.io",
    ];

    fn message() -> impl Strategy<Value = Message> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..64).prop_map(Message::binary),
            (any::<u8>(), any::<u8>()).prop_map(|(a, b)| Message::binary(vec![CLOSE_SIGNAL, a, b])),
            any::<String>().prop_map(Message::text),
            ("[0-9]", "[A-Za-z0-9+/=]{0,40}").prop_map(|(c, b)| Message::text(c + &b)),
            proptest::collection::vec(any::<u8>(), 0..16).prop_map(|p| Message::Ping(p.into())),
            Just(Message::Close(None)),
        ]
    }

    proptest! {
        #![proptest_config(crust_quote::testing::config(1024))]

        /// What this side encodes on a channel, the decoder gives back, on
        /// every protocol and channel (255 is v5's close signal, never a
        /// data channel).
        #[test]
        fn channel_messages_round_trip(
            proto in proptest::sample::select(PROTOCOLS.to_vec()),
            channel in any::<u8>(),
            data in proptest::collection::vec(any::<u8>(), 0..200),
        ) {
            let p = protocol_of(Some(proto));
            prop_assume!(!(p.close_signal && channel == CLOSE_SIGNAL));
            let got = decode(p, encode(p.codec, channel, &data));
            prop_assert_eq!(got, Incoming::Data(channel, Bytes::from(data)));
        }

        /// Any client message decodes to something, never a panic.
        #[test]
        fn any_message_decodes(
            proto in proptest::option::of(proptest::sample::select(PROTOCOLS.to_vec())),
            msg in message(),
        ) {
            let p = protocol_of(proto);
            match decode(p, msg.clone()) {
                Incoming::CloseChannel(_) => prop_assert!(p.close_signal),
                Incoming::End => prop_assert!(matches!(msg, Message::Close(_) | Message::Binary(_))),
                Incoming::Data(..) | Incoming::Skip => {}
            }
        }
    }

    #[test]
    fn channel_encoding() {
        assert_eq!(
            encode(Codec::Binary, 1, b"hi"),
            Message::binary(vec![1, b'h', b'i'])
        );
        assert_eq!(encode(Codec::Base64, 2, b"hi"), Message::text("2aGk="));
        assert!(protocol_of(Some("v5.channel.k8s.io")).close_signal);
        assert!(!protocol_of(None).v4_status);
    }
}
