//! A small OTLP/gRPC trace receiver on 127.0.0.1, as an OpenTelemetry
//! collector would be for the daemon (`[tracing] endpoint`): it keeps
//! every span exported to it and counts the connections made to it (so a
//! test can tell that a daemon without tracing never tried). It runs on a
//! thread and runtime of its own, so that it keeps serving while a test's
//! `Daemon` blocks in its drop (the daemon exports its last spans then).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use tokio_stream::StreamExt;

/// `Span.kind` of a server span (OTLP's `SPAN_KIND_SERVER`).
pub const SPAN_KIND_SERVER: i32 = 2;

/// One span as received, ids in lower-case hex (as W3C `traceparent`
/// writes them; a root span's `parent_span_id` is "").
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub service_name: String,
    pub name: String,
    pub kind: i32,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    /// Attributes with their values as text.
    pub attributes: Vec<(String, String)>,
}

impl ReceivedSpan {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct State {
    spans: Mutex<Vec<ReceivedSpan>>,
    connections: AtomicUsize,
}

/// The receiver; stops on drop.
pub struct Receiver {
    addr: SocketAddr,
    state: Arc<State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    /// Listens on a free port of 127.0.0.1.
    pub fn start() -> Receiver {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding the receiver");
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = state.clone();
        let thread = std::thread::Builder::new()
            .name("otlp-receiver".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(serve(listener, served, stopped));
            })
            .unwrap();
        Receiver {
            addr,
            state,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`, for `[tracing] endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.state.spans.lock().unwrap().clone()
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Waits until `done` holds for the spans received (the daemon exports
    /// in batches, every few seconds), at most `timeout`; returns the spans
    /// either way.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let deadline = Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if done(&spans) || Instant::now() >= deadline {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether `ancestor` is `span`'s parent, grandparent, ... in `spans`.
pub fn descends_from(spans: &[ReceivedSpan], span: &ReceivedSpan, ancestor: &ReceivedSpan) -> bool {
    let mut parent = span.parent_span_id.clone();
    // Bounded: a cycle in what was received must not hang a test.
    for _ in 0..spans.len() {
        if parent.is_empty() {
            return false;
        }
        if parent == ancestor.span_id && span.trace_id == ancestor.trace_id {
            return true;
        }
        match spans
            .iter()
            .find(|s| s.span_id == parent && s.trace_id == span.trace_id)
        {
            Some(p) => parent = p.parent_span_id.clone(),
            None => return false,
        }
    }
    false
}

/// A summary of `spans` for assertion messages: name, ids, parent.
pub fn describe(spans: &[ReceivedSpan]) -> String {
    spans
        .iter()
        .map(|s| {
            format!(
                "{} trace={} span={} parent={} {:?}\n",
                s.name, s.trace_id, s.span_id, s.parent_span_id, s.attributes
            )
        })
        .collect()
}

async fn serve(
    listener: std::net::TcpListener,
    state: Arc<State>,
    stopped: tokio::sync::oneshot::Receiver<()>,
) {
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    let counted = state.clone();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(move |conn| {
        counted.connections.fetch_add(1, Ordering::SeqCst);
        conn
    });
    let _ = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(Collector { state }))
        .serve_with_incoming_shutdown(incoming, async {
            let _ = stopped.await;
        })
        .await;
}

struct Collector {
    state: Arc<State>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = Vec::new();
        for rs in request.into_inner().resource_spans {
            let service_name = rs
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
                .map(|kv| text(kv.value.as_ref()))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    received.push(ReceivedSpan {
                        service_name: service_name.clone(),
                        name: s.name,
                        kind: s.kind,
                        trace_id: hex::encode(&s.trace_id),
                        span_id: hex::encode(&s.span_id),
                        parent_span_id: hex::encode(&s.parent_span_id),
                        attributes: s.attributes.iter().map(pair).collect(),
                    });
                }
            }
        }
        self.state.spans.lock().unwrap().extend(received);
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn pair(kv: &KeyValue) -> (String, String) {
    (kv.key.clone(), text(kv.value.as_ref()))
}

fn text(v: Option<&AnyValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}
