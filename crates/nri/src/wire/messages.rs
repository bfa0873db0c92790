//! ttrpc's own envelope messages (package `ttrpc` in containerd/ttrpc's
//! request.proto; field numbers and types as there, comments ours).

/// A call: which method of which service, and its protobuf-encoded request.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Request {
    #[prost(string, tag = "1")]
    pub service: String,
    #[prost(string, tag = "2")]
    pub method: String,
    #[prost(bytes = "vec", tag = "3")]
    pub payload: Vec<u8>,
    /// The caller's deadline, relative, in nanoseconds (0: none).
    #[prost(int64, tag = "4")]
    pub timeout_nano: i64,
    #[prost(message, repeated, tag = "5")]
    pub metadata: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// The answer: a status (gRPC codes) and the encoded response on success.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Response {
    #[prost(message, optional, tag = "1")]
    pub status: Option<Status>,
    #[prost(bytes = "vec", tag = "2")]
    pub payload: Vec<u8>,
}

/// google.rpc.Status.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Status {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<Any>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Any {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// The gRPC status codes NRI cares about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub(crate) enum Code {
    Ok = 0,
    Unknown = 2,
    InvalidArgument = 3,
    AlreadyExists = 6,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Unimplemented = 12,
}

impl Status {
    pub fn new(code: Code, message: impl Into<String>) -> Status {
        Status {
            code: code as i32,
            message: message.into(),
            details: Vec::new(),
        }
    }
}
