//! Exec and attach sessions (`remotecommand`), over SPDY and WebSocket.

use std::sync::Arc;
use std::time::Duration;

use hyper_tungstenite::HyperWebsocketStream;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::backend::{
    AttachRequest, Backend, BoxRead, BoxWrite, ExecRequest, StreamIo, TerminalSize,
};
use crate::spdy::{Session, SpdyStream, frame::rst};
use crate::status::Outcome;
use crate::ws::{self, Channels};

/// SPDY subprotocols, newest first.
pub(crate) const SPDY_PROTOCOLS: &[&str] = &[
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];
/// WebSocket subprotocols.
pub(crate) const WS_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
];

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;

/// An exec or an attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Invocation {
    Exec(ExecRequest),
    Attach(AttachRequest),
}

impl Invocation {
    /// (stdin, stdout, stderr, tty)
    fn opts(&self) -> (bool, bool, bool, bool) {
        match self {
            Invocation::Exec(r) => (r.stdin, r.stdout, r.stderr, r.tty),
            Invocation::Attach(r) => (r.stdin, r.stdout, r.stderr, r.tty),
        }
    }
}

/// Timeouts the sessions use.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub stream_creation: Duration,
    pub disconnect_grace: Duration,
    pub linger: Duration,
}

/// Runs the backend call; when the client goes away the call gets
/// `grace` to notice before it is dropped.
async fn run_backend(
    backend: &Arc<dyn Backend>,
    inv: Invocation,
    io: StreamIo,
    disconnected: impl std::future::Future<Output = ()>,
    grace: Duration,
) -> Outcome {
    let call = async {
        match inv {
            Invocation::Exec(r) => match backend.exec(r, io).await {
                Ok(0) => Outcome::Success,
                Ok(code) => Outcome::ExitCode(code),
                Err(e) => Outcome::Error(format!("error executing command in container: {e}")),
            },
            Invocation::Attach(r) => match backend.attach(r, io).await {
                Ok(()) => Outcome::Success,
                Err(e) => Outcome::Error(format!("error attaching to container: {e}")),
            },
        }
    };
    tokio::pin!(call);
    tokio::select! {
        o = &mut call => o,
        _ = disconnected => match tokio::time::timeout(grace, &mut call).await {
            Ok(o) => o,
            Err(_) => {
                tracing::info!("streaming client went away; cancelling the backend call");
                Outcome::Error("client disconnected".into())
            }
        },
    }
}

/// Incremental decoder of the resize stream: concatenated JSON objects
/// `{"Width":80,"Height":24}` (Go's field names; matched case-insensitively
/// like Go does for the two spellings seen in practice).
#[derive(Default)]
pub(crate) struct ResizeDecoder {
    buf: Vec<u8>,
}

#[derive(Deserialize)]
struct SizeJson {
    #[serde(alias = "width", default)]
    #[serde(rename = "Width")]
    width: u16,
    #[serde(alias = "height", default)]
    #[serde(rename = "Height")]
    height: u16,
}

impl ResizeDecoder {
    const MAX: usize = 4096;

    /// Adds bytes; appends complete sizes to `out`. An error ends the
    /// stream (garbage, or an object larger than any size message).
    pub(crate) fn push(&mut self, data: &[u8], out: &mut Vec<TerminalSize>) -> Result<(), String> {
        self.buf.extend_from_slice(data);
        let mut consumed = 0;
        {
            let mut it = serde_json::Deserializer::from_slice(&self.buf).into_iter::<SizeJson>();
            loop {
                match it.next() {
                    Some(Ok(s)) => {
                        consumed = it.byte_offset();
                        out.push(TerminalSize {
                            width: s.width,
                            height: s.height,
                        });
                    }
                    Some(Err(e)) if e.is_eof() => break,
                    Some(Err(e)) => return Err(e.to_string()),
                    None => {
                        consumed = self.buf.len();
                        break;
                    }
                }
            }
        }
        self.buf.drain(..consumed);
        if self.buf.len() > Self::MAX {
            return Err("resize message too large".into());
        }
        Ok(())
    }
}

/// Feeds terminal sizes from a resize stream to the backend.
async fn pump_resize(mut r: impl AsyncRead + Unpin, tx: mpsc::Sender<TerminalSize>) {
    let mut dec = ResizeDecoder::default();
    let mut buf = [0u8; 1024];
    let mut sizes = Vec::new();
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Err(e) = dec.push(&buf[..n], &mut sizes) {
            tracing::debug!("bad resize stream: {e}");
            return;
        }
        for s in sizes.drain(..) {
            if tx.send(s).await.is_err() {
                return;
            }
        }
    }
}

/// Serves an exec or attach over an upgraded SPDY/3.1 connection.
pub(crate) async fn serve_spdy(
    mut session: Session,
    protocol: &'static str,
    inv: Invocation,
    backend: Arc<dyn Backend>,
    t: Timeouts,
) {
    let (want_stdin, want_stdout, want_stderr, tty) = inv.opts();
    let v4 = protocol == "v4.channel.k8s.io";
    let resize_supported = matches!(protocol, "v4.channel.k8s.io" | "v3.channel.k8s.io");

    let mut error: Option<SpdyStream> = None;
    let mut stdin: Option<SpdyStream> = None;
    let mut stdout: Option<SpdyStream> = None;
    let mut stderr: Option<SpdyStream> = None;
    let mut resize: Option<SpdyStream> = None;
    let deadline = tokio::time::sleep(t.stream_creation);
    tokio::pin!(deadline);
    loop {
        let complete = error.is_some()
            && (!want_stdin || stdin.is_some())
            && (!want_stdout || stdout.is_some())
            && (!want_stderr || stderr.is_some())
            && (!(tty && resize_supported) || resize.is_some());
        if complete {
            break;
        }
        let s = tokio::select! {
            s = session.accept() => match s {
                Some(s) => s,
                None => return,
            },
            _ = &mut deadline => {
                tracing::info!("streaming client did not create its streams in time");
                session.shutdown().await;
                return;
            }
        };
        let slot = match s.header("streamtype") {
            Some("error") => &mut error,
            Some("stdin") => &mut stdin,
            Some("stdout") => &mut stdout,
            Some("stderr") => &mut stderr,
            Some("resize") => &mut resize,
            other => {
                tracing::debug!(stream_type = ?other, "refusing unexpected stream");
                s.reset(rst::REFUSED_STREAM);
                continue;
            }
        };
        if slot.is_some() {
            s.reset(rst::PROTOCOL_ERROR);
            continue;
        }
        s.reply();
        *slot = Some(s);
    }
    let error = error.expect("checked above");

    // Streams that were not asked for are closed at the end like the rest.
    let (resize_tx, resize_rx) = mpsc::channel(8);
    let resize_rx = if tty {
        if let Some(r) = &resize {
            tokio::spawn(pump_resize(r.handle(), resize_tx));
        }
        Some(resize_rx)
    } else {
        None
    };
    let io = StreamIo {
        stdin: if want_stdin {
            stdin.as_ref().map(|s| Box::new(s.handle()) as BoxRead)
        } else {
            None
        },
        stdout: if want_stdout {
            stdout.as_ref().map(|s| Box::new(s.handle()) as BoxWrite)
        } else {
            None
        },
        stderr: if want_stderr {
            stderr.as_ref().map(|s| Box::new(s.handle()) as BoxWrite)
        } else {
            None
        },
        resize: resize_rx,
    };
    let outcome = run_backend(&backend, inv, io, session.closed(), t.disconnect_grace).await;

    if !session.is_closed() {
        for s in [&mut stdout, &mut stderr].into_iter().flatten() {
            let _ = s.shutdown().await;
        }
        let mut error = error;
        let msg = if v4 {
            outcome.to_v4_json()
        } else {
            outcome.to_text()
        };
        if !msg.is_empty() {
            let _ = error.write_all(&msg).await;
        }
        let _ = error.shutdown().await;
        for s in [&mut stdin, &mut resize].into_iter().flatten() {
            let _ = s.shutdown().await;
        }
        drop((stdin, stdout, stderr, resize));
        session.shutdown().await;
    }
}

/// Serves an exec or attach over a WebSocket.
pub(crate) async fn serve_ws(
    ws: HyperWebsocketStream,
    protocol: Option<&str>,
    inv: Invocation,
    backend: Arc<dyn Backend>,
    t: Timeouts,
) {
    let proto = ws::protocol_of(protocol);
    let (want_stdin, want_stdout, want_stderr, tty) = inv.opts();
    let mut channels = Channels::start(ws, proto, &[STDIN, RESIZE], t.linger);
    // Tell the client the session is up: an empty message on the lowest
    // channel it reads (what kubelet does).
    let first = if want_stdout {
        STDOUT
    } else if want_stderr {
        STDERR
    } else {
        ERROR
    };
    channels.send(first, &[]).await;

    let (resize_tx, resize_rx) = mpsc::channel(8);
    let resize_reader = channels.reader(RESIZE);
    let resize_rx = if tty {
        if let Some(r) = resize_reader {
            tokio::spawn(pump_resize(r, resize_tx));
        }
        Some(resize_rx)
    } else {
        None
    };
    let io = StreamIo {
        stdin: if want_stdin {
            channels.reader(STDIN).map(|r| Box::new(r) as BoxRead)
        } else {
            None
        },
        stdout: want_stdout.then(|| Box::new(channels.writer(STDOUT)) as BoxWrite),
        stderr: want_stderr.then(|| Box::new(channels.writer(STDERR)) as BoxWrite),
        resize: resize_rx,
    };
    channels.discard_untaken();
    let outcome = run_backend(&backend, inv, io, channels.closed(), t.disconnect_grace).await;
    let msg = if proto.v4_status {
        outcome.to_v4_json()
    } else {
        outcome.to_text()
    };
    if !msg.is_empty() {
        channels.send(ERROR, &msg).await;
    }
    channels.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn resize_messages_split_anywhere() {
        let wire = br#"{"Width":80,"Height":24}
{"Width":120,"Height":40}{"width":1,"height":2} "#;
        for split in 0..wire.len() {
            let mut d = ResizeDecoder::default();
            let mut out = Vec::new();
            d.push(&wire[..split], &mut out).unwrap();
            d.push(&wire[split..], &mut out).unwrap();
            assert_eq!(
                out,
                vec![
                    TerminalSize {
                        width: 80,
                        height: 24
                    },
                    TerminalSize {
                        width: 120,
                        height: 40
                    },
                    TerminalSize {
                        width: 1,
                        height: 2
                    }
                ],
                "split at {split}"
            );
        }
    }

    fn size_json() -> impl Strategy<Value = (TerminalSize, String)> {
        (any::<u16>(), any::<u16>(), any::<bool>(), "[ \t\n]{0,3}").prop_map(
            |(width, height, lower, space)| {
                let json = if lower {
                    format!("{{\"width\":{width},{space}\"height\":{height}}}{space}")
                } else {
                    format!("{space}{{\"Width\":{width},\"Height\":{height}}}")
                };
                (TerminalSize { width, height }, json)
            },
        )
    }

    proptest! {
        #![proptest_config(crust_quote::testing::config(1024))]

        /// A stream of size messages cut anywhere gives back every size.
        #[test]
        fn resize_streams_split_anywhere(
            sizes in proptest::collection::vec(size_json(), 1..10),
            cuts in proptest::collection::vec(1usize..40, 1..6),
        ) {
            let wire: String = sizes.iter().map(|(_, j)| j.as_str()).collect();
            let mut d = ResizeDecoder::default();
            let mut out = Vec::new();
            let mut rest = wire.as_bytes();
            let mut cuts = cuts.iter().cycle();
            while !rest.is_empty() {
                let n = (*cuts.next().unwrap()).min(rest.len());
                d.push(&rest[..n], &mut out).unwrap();
                rest = &rest[n..];
            }
            let want: Vec<TerminalSize> = sizes.into_iter().map(|(s, _)| s).collect();
            prop_assert_eq!(out, want);
        }

        /// Any bytes: sizes or an error, never a panic, and never more
        /// buffered than one size message can take.
        #[test]
        fn any_resize_bytes_are_bounded(chunks in proptest::collection::vec(
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..1024),
                "[{}\"Wdthieg:0-9, ]{0,64}".prop_map(String::into_bytes),
            ],
            1..12,
        )) {
            let mut d = ResizeDecoder::default();
            let mut out = Vec::new();
            for c in chunks {
                if d.push(&c, &mut out).is_err() {
                    break;
                }
                prop_assert!(d.buf.len() <= ResizeDecoder::MAX);
            }
        }
    }

    #[test]
    fn bad_resize_input_is_an_error() {
        let mut out = Vec::new();
        assert!(
            ResizeDecoder::default()
                .push(b"nonsense", &mut out)
                .is_err()
        );
        assert!(
            ResizeDecoder::default()
                .push(br#"{"Width":99999999}"#, &mut out)
                .is_err()
        );
        let mut d = ResizeDecoder::default();
        let long = format!("{{\"Width\":1{}", " ".repeat(5000));
        assert!(d.push(long.as_bytes(), &mut out).is_err());
    }
}
