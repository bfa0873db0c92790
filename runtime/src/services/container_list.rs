//! ListContainers from encoded entries. kubelet lists every container of
//! the node every second; building each `Container` message (its label and
//! annotation maps, a dozen strings) and encoding it on every call was most
//! of what the call cost. Each entry is encoded once per version of its
//! record and kept with that version: a record that changes is a new
//! `Arc` (`index::Entry::set`), so an entry can never be served for a
//! record other than the one it was made from.
//!
//! The response is written by a codec of its own ([`EncodedList`]): the
//! bytes of a `ListContainersResponse` are its `Container`s' bytes, each
//! behind its field tag and length, so the kept entries are copied out as
//! they are. Served in front of the generated `RuntimeService` server
//! ([`RuntimeServer`]), for this one path.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes};
use crust_api::v1::ListContainersRequest;
#[cfg(test)]
use crust_api::v1::ListContainersResponse;
use crust_api::v1::runtime_service_server::RuntimeServiceServer;
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::{NamedService, UnaryService};
use tonic::{Request, Response, Status};

use super::Cri;
use crate::api_version::ApiVersion;
use crate::containers::ContainerRecord;

const PATH: &str = "/runtime.v1.RuntimeService/ListContainers";

/// One container's encoded `Container`, per API version (they differ in
/// `image_ref`), made when first asked for.
struct Kept {
    record: Arc<ContainerRecord>,
    v1: Option<Bytes>,
    v1alpha2: Option<Bytes>,
}

/// Encoded list entries by container ID.
#[derive(Default)]
pub struct ListCache {
    kept: Mutex<HashMap<String, Kept>>,
}

impl ListCache {
    /// The encoded entries of `records`, in their order; `all` is how many
    /// containers exist (entries of removed ones are dropped when the
    /// cache holds more).
    pub fn encode(
        &self,
        records: &[Arc<ContainerRecord>],
        all: &[Arc<ContainerRecord>],
        api: ApiVersion,
    ) -> EncodedList {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let mut items = Vec::with_capacity(records.len());
        for rec in records {
            let k = match kept.get_mut(rec.id.as_str()) {
                Some(k) if Arc::ptr_eq(&k.record, rec) => k,
                _ => {
                    kept.insert(
                        rec.id.clone(),
                        Kept {
                            record: Arc::clone(rec),
                            v1: None,
                            v1alpha2: None,
                        },
                    );
                    kept.get_mut(rec.id.as_str()).expect("just inserted")
                }
            };
            let slot = match api {
                ApiVersion::V1 => &mut k.v1,
                ApiVersion::V1Alpha2 => &mut k.v1alpha2,
            };
            let bytes = slot.get_or_insert_with(|| {
                Bytes::from(super::container::list_item(&k.record, api).encode_to_vec())
            });
            items.push(bytes.clone());
        }
        if kept.len() > all.len() {
            let live: HashSet<&str> = all.iter().map(|r| r.id.as_str()).collect();
            kept.retain(|id, _| live.contains(id.as_str()));
        }
        EncodedList::new(items)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.kept.lock().unwrap().len()
    }
}

/// A `ListContainersResponse` as the bytes of its entries.
#[derive(Debug, Default)]
pub struct EncodedList {
    items: Vec<Bytes>,
    len: usize,
}

impl EncodedList {
    fn new(items: Vec<Bytes>) -> EncodedList {
        let len = items
            .iter()
            .map(|b| 1 + encoded_len_varint(b.len() as u64) + b.len())
            .sum();
        EncodedList { items, len }
    }

    /// Field 1 (`containers`), length-delimited, once per entry: what
    /// prost writes for `ListContainersResponse`.
    fn write(&self, buf: &mut impl BufMut) {
        for b in &self.items {
            encode_key(1, WireType::LengthDelimited, buf);
            encode_varint(b.len() as u64, buf);
            buf.put_slice(b);
        }
    }

    #[cfg(test)]
    fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        self.write(&mut out);
        out
    }
}

/// Decodes the request as the generated server does (a decode error is
/// Internal, as tonic-prost answers), writes an [`EncodedList`].
#[derive(Debug, Clone, Copy, Default)]
struct ListCodec;

impl Codec for ListCodec {
    type Encode = EncodedList;
    type Decode = ListContainersRequest;
    type Encoder = ListEncoder;
    type Decoder = ListDecoder;

    fn encoder(&mut self) -> ListEncoder {
        ListEncoder
    }

    fn decoder(&mut self) -> ListDecoder {
        ListDecoder
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct ListDecoder;

impl Decoder for ListDecoder {
    type Item = ListContainersRequest;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Status> {
        ListContainersRequest::decode(buf)
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct ListEncoder;

impl Encoder for ListEncoder {
    type Item = EncodedList;
    type Error = Status;

    fn encode(&mut self, item: EncodedList, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // All at once: no regrowing (and copying) of a buffer of
        // hundreds of KiB as it fills.
        buf.reserve(item.len);
        item.write(buf);
        Ok(())
    }
}

impl Cri {
    /// ListContainers, answered with the kept encoded entries.
    async fn list_containers_encoded(
        &self,
        req: Request<ListContainersRequest>,
    ) -> Result<Response<EncodedList>, Status> {
        let api = ApiVersion::of(&req);
        let (matching, all) = self.listed(req.into_inner().filter)?;
        Ok(Response::new(self.list_cache.encode(&matching, &all, api)))
    }
}

struct ListSvc(Cri);

impl UnaryService<ListContainersRequest> for ListSvc {
    type Response = EncodedList;
    type Future = std::pin::Pin<
        Box<dyn Future<Output = Result<Response<EncodedList>, Status>> + Send + 'static>,
    >;

    fn call(&mut self, req: Request<ListContainersRequest>) -> Self::Future {
        let cri = self.0.clone();
        Box::pin(async move { cri.list_containers_encoded(req).await })
    }
}

/// The `RuntimeService` server, with ListContainers answered from
/// [`ListCache`] and every other call passed to the generated server.
#[derive(Clone)]
pub struct RuntimeServer {
    inner: RuntimeServiceServer<Cri>,
    cri: Cri,
}

impl RuntimeServer {
    pub fn new(cri: Cri) -> RuntimeServer {
        RuntimeServer {
            inner: RuntimeServiceServer::new(cri.clone()),
            cri,
        }
    }
}

impl NamedService for RuntimeServer {
    const NAME: &'static str = <RuntimeServiceServer<Cri> as NamedService>::NAME;
}

type BoxFuture<T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl tower::Service<http::Request<tonic::body::Body>> for RuntimeServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        if req.uri().path() == PATH {
            let svc = ListSvc(self.cri.clone());
            return Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(ListCodec);
                Ok(grpc.unary(svc, req).await)
            });
        }
        Box::pin(self.inner.call(req))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::containers::ContainerState;

    fn record(id: &str) -> Arc<ContainerRecord> {
        Arc::new(ContainerRecord::for_test(id, "p1", &format!("n-{id}")))
    }

    #[test]
    fn the_encoded_list_is_what_prost_writes() {
        let cache = ListCache::default();
        let mut a = (*record("a1")).clone();
        a.labels.insert("app".into(), "web".into());
        a.annotations.insert("k".into(), "v".into());
        let all = vec![Arc::new(a), record("b2")];
        for api in [ApiVersion::V1, ApiVersion::V1Alpha2] {
            let got = cache.encode(&all, &all, api).to_vec();
            let want = ListContainersResponse {
                containers: all
                    .iter()
                    .map(|r| super::super::container::list_item(r, api))
                    .collect(),
            }
            .encode_to_vec();
            assert_eq!(got, want);
            assert_eq!(
                ListContainersResponse::decode(got.as_slice()).unwrap(),
                ListContainersResponse::decode(want.as_slice()).unwrap()
            );
        }
    }

    #[test]
    fn a_changed_record_is_encoded_again_and_removed_ones_go() {
        let cache = ListCache::default();
        let a = record("a1");
        let b = record("b2");
        let all = vec![a.clone(), b.clone()];
        let first = cache.encode(&all, &all, ApiVersion::V1);
        // Stopped: a new record (a new Arc), as Entry::set makes.
        let mut stopped = (*a).clone();
        stopped.state = ContainerState::Exited;
        let stopped = Arc::new(stopped);
        let all = vec![stopped.clone(), b.clone()];
        let second = cache.encode(&all, &all, ApiVersion::V1);
        assert_ne!(first.items[0], second.items[0]);
        assert_eq!(first.items[1], second.items[1]);
        let decoded = ListContainersResponse::decode(second.to_vec().as_slice()).unwrap();
        assert_eq!(
            decoded.containers[0].state,
            crust_api::v1::ContainerState::ContainerExited as i32
        );
        // b removed.
        let all = vec![stopped.clone()];
        cache.encode(&all, &all, ApiVersion::V1);
        assert_eq!(cache.len(), 1);
    }
}
