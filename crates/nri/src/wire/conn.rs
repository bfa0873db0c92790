//! One NRI socket: a ttrpc client on one logical connection and a ttrpc
//! server on the other, both driven by one reader task.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::messages::{Request, Response};
use super::{
    Code, MAX_MESSAGE_LEN, MAX_MUX_PAYLOAD, MUX_HEADER_LEN, PLUGIN_SERVICE_CONN,
    RUNTIME_SERVICE_CONN, Reassembler, Status, TYPE_REQUEST, TYPE_RESPONSE, encode_message,
};

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Serves the requests arriving on the server side of a connection.
pub(crate) trait Handler: Send + Sync + 'static {
    /// `method` is "<service>/<method>"; the answer is an encoded response.
    fn handle(
        &self,
        service: &str,
        method: &str,
        payload: Vec<u8>,
    ) -> BoxFuture<Result<Vec<u8>, Status>>;
}

/// Which end of NRI this side is.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Role {
    /// Calls the plugin's services, serves the runtime's.
    Runtime,
    /// Calls the runtime's services, serves the plugin's.
    Plugin,
}

impl Role {
    fn client_conn(self) -> u32 {
        match self {
            Role::Runtime => PLUGIN_SERVICE_CONN,
            Role::Plugin => RUNTIME_SERVICE_CONN,
        }
    }
    fn server_conn(self) -> u32 {
        match self {
            Role::Runtime => RUNTIME_SERVICE_CONN,
            Role::Plugin => PLUGIN_SERVICE_CONN,
        }
    }
}

/// Why a call did not return a response.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum CallError {
    #[error("connection closed")]
    Closed,
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The peer answered with an error status.
    #[error("{}", .0.message)]
    Status(Status),
}

impl CallError {
    /// Errors after which the peer is unusable (NRI closes such plugins).
    pub fn is_fatal(&self) -> bool {
        !matches!(self, CallError::Status(_))
    }
}

type Reply = Result<Response, CallError>;

struct Shared {
    role: Role,
    writer: tokio::sync::Mutex<Option<OwnedWriteHalf>>,
    pending: Mutex<Pending>,
    next_stream: AtomicU32,
    closed: watch::Sender<bool>,
    reader: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Default)]
struct Pending {
    closed: bool,
    calls: HashMap<u32, oneshot::Sender<Reply>>,
}

/// A connected NRI peer.
#[derive(Clone)]
pub(crate) struct Connection {
    shared: Arc<Shared>,
}

impl Connection {
    /// Starts serving `stream`: requests on the server side go to `handler`.
    pub fn start(stream: UnixStream, role: Role, handler: Arc<dyn Handler>) -> Connection {
        let (read, write) = stream.into_split();
        let (closed, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            role,
            writer: tokio::sync::Mutex::new(Some(write)),
            pending: Mutex::new(Pending::default()),
            next_stream: AtomicU32::new(1),
            closed,
            reader: Mutex::new(None),
        });
        let task = tokio::spawn(read_loop(shared.clone(), read, handler));
        *shared.reader.lock().unwrap() = Some(task);
        Connection { shared }
    }

    /// Calls `service`/`method`, waiting at most `timeout` for the answer.
    pub async fn call<Req, Resp>(
        &self,
        service: &str,
        method: &str,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp, CallError>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        let request = Request {
            service: service.to_string(),
            method: method.to_string(),
            payload: req.encode_to_vec(),
            timeout_nano: i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX),
            metadata: Vec::new(),
        };
        let body = request.encode_to_vec();
        if body.len() > MAX_MESSAGE_LEN {
            return Err(CallError::Status(Status::new(
                Code::ResourceExhausted,
                format!(
                    "message length {} exceeds maximum message size of {MAX_MESSAGE_LEN}",
                    body.len()
                ),
            )));
        }
        let stream = self.shared.next_stream.fetch_add(2, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.shared.pending.lock().unwrap();
            if p.closed {
                return Err(CallError::Closed);
            }
            p.calls.insert(stream, tx);
        }
        let frames = encode_message(self.shared.role.client_conn(), stream, TYPE_REQUEST, &body);
        let exchange = async {
            self.shared.write(&frames).await?;
            rx.await.unwrap_or(Err(CallError::Closed))
        };
        let reply = match tokio::time::timeout(timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(CallError::Timeout(timeout)),
        };
        self.shared.pending.lock().unwrap().calls.remove(&stream);
        let response = reply?;
        if let Some(status) = response.status
            && status.code != Code::Ok as i32
        {
            return Err(CallError::Status(status));
        }
        Resp::decode(response.payload.as_slice())
            .map_err(|e| CallError::Protocol(format!("cannot decode {method} response: {e}")))
    }

    /// Closes the socket; pending and later calls fail with `Closed`.
    pub fn close(&self) {
        Shared::close(&self.shared);
    }

    pub fn is_closed(&self) -> bool {
        *self.shared.closed.borrow()
    }

    /// Resolves once the connection is closed (by either side).
    pub async fn closed(&self) {
        let mut rx = self.shared.closed.subscribe();
        let _ = rx.wait_for(|c| *c).await;
    }

    /// Pid of the peer process (SO_PEERCRED), for logs.
    pub fn peer_pid(stream: &UnixStream) -> Option<i32> {
        stream.peer_cred().ok().and_then(|c| c.pid())
    }
}

impl Shared {
    async fn write(self: &Arc<Self>, frames: &[u8]) -> Result<(), CallError> {
        let mut closed = self.closed.subscribe();
        let mut w = self.writer.lock().await;
        let Some(half) = w.as_mut() else {
            return Err(CallError::Closed);
        };
        // A peer that stops reading must not pin a writer (and this lock)
        // forever: closing the connection cancels the write.
        let written = tokio::select! {
            r = half.write_all(frames) => r.is_ok(),
            _ = closed.wait_for(|c| *c) => false,
        };
        if !written {
            w.take();
            drop(w);
            self.close();
            return Err(CallError::Closed);
        }
        Ok(())
    }

    fn close(self: &Arc<Self>) {
        let calls = {
            let mut p = self.pending.lock().unwrap();
            if p.closed {
                return;
            }
            p.closed = true;
            std::mem::take(&mut p.calls)
        };
        for (_, tx) in calls {
            let _ = tx.send(Err(CallError::Closed));
        }
        self.closed.send_replace(true);
        if let Some(task) = self.reader.lock().unwrap().take() {
            task.abort();
        }
        // The aborted reader drops the read half; dropping the write half too
        // closes the socket (a write in progress is cancelled by `closed`).
        let shared = self.clone();
        tokio::spawn(async move {
            shared.writer.lock().await.take();
        });
    }
}

async fn read_loop(shared: Arc<Shared>, mut read: OwnedReadHalf, handler: Arc<dyn Handler>) {
    if let Err(e) = serve(&shared, &mut read, &handler).await {
        tracing::debug!(error = %e, "NRI connection ended");
    }
    // Not `close()` directly: it would abort this very task mid-cleanup.
    let calls = {
        let mut p = shared.pending.lock().unwrap();
        p.closed = true;
        std::mem::take(&mut p.calls)
    };
    for (_, tx) in calls {
        let _ = tx.send(Err(CallError::Closed));
    }
    shared.closed.send_replace(true);
    shared.reader.lock().unwrap().take();
    shared.writer.lock().await.take();
}

async fn serve(
    shared: &Arc<Shared>,
    read: &mut OwnedReadHalf,
    handler: &Arc<dyn Handler>,
) -> Result<(), String> {
    let client_conn = shared.role.client_conn();
    let server_conn = shared.role.server_conn();
    let mut responses = Reassembler::default();
    let mut requests = Reassembler::default();
    let mut last_request_stream = 0u32;
    let mut hdr = [0u8; MUX_HEADER_LEN];
    let mut chunk = Vec::new();
    loop {
        if let Err(e) = read.read_exact(&mut hdr).await {
            return Err(format!("read: {e}"));
        }
        let conn = u32::from_be_bytes(hdr[0..4].try_into().unwrap());
        let len = u32::from_be_bytes(hdr[4..8].try_into().unwrap()) as usize;
        if len > MAX_MUX_PAYLOAD {
            return Err(format!("multiplexer chunk of {len} bytes is too large"));
        }
        chunk.resize(len, 0);
        read.read_exact(&mut chunk)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if conn == client_conn {
            responses.push(&chunk);
            while let Some(m) = responses.next_message()? {
                if m.kind != TYPE_RESPONSE {
                    return Err(format!(
                        "unexpected ttrpc message type {} on the client side",
                        m.kind
                    ));
                }
                let resp = Response::decode(m.body.as_slice())
                    .map_err(|e| format!("bad ttrpc response: {e}"))?;
                let tx = shared.pending.lock().unwrap().calls.remove(&m.stream);
                if let Some(tx) = tx {
                    let _ = tx.send(Ok(resp));
                }
            }
        } else if conn == server_conn {
            requests.push(&chunk);
            while let Some(m) = requests.next_message()? {
                if m.kind != TYPE_REQUEST {
                    return Err(format!(
                        "unexpected ttrpc message type {} on the server side",
                        m.kind
                    ));
                }
                if m.stream % 2 != 1 || m.stream <= last_request_stream {
                    return Err(format!("invalid ttrpc request stream id {}", m.stream));
                }
                last_request_stream = m.stream;
                let req = Request::decode(m.body.as_slice())
                    .map_err(|e| format!("bad ttrpc request: {e}"))?;
                let shared = shared.clone();
                let handler = handler.clone();
                tokio::spawn(async move {
                    let answer = handler.handle(&req.service, &req.method, req.payload).await;
                    let response = match answer {
                        Ok(payload) => Response {
                            status: Some(Status::new(Code::Ok, "")),
                            payload,
                        },
                        Err(status) => Response {
                            status: Some(status),
                            payload: Vec::new(),
                        },
                    };
                    let frames = encode_message(
                        server_conn,
                        m.stream,
                        TYPE_RESPONSE,
                        &response.encode_to_vec(),
                    );
                    let _ = shared.write(&frames).await;
                });
            }
        }
        // Chunks for other logical connections are dropped, as NRI's
        // multiplexer does for connections nobody opened.
    }
}
