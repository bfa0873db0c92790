//! Single-use, expiring URL tokens.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine;
use tokio::time::Instant;

use crate::Error;
use crate::backend::PortForwardRequest;
use crate::remotecommand::Invocation;

/// What a token stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pending {
    /// Exec or attach: served by `remotecommand`.
    Command(Invocation),
    PortForward(PortForwardRequest),
}

impl Pending {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Pending::Command(Invocation::Exec(_)) => "exec",
            Pending::Command(Invocation::Attach(_)) => "attach",
            Pending::PortForward(_) => "portforward",
        }
    }
}

/// 128 random bits, URL-safe base64 without padding.
pub(crate) const TOKEN_LEN: usize = 22;

pub(crate) struct TokenCache {
    ttl: Duration,
    max: usize,
    map: Mutex<HashMap<String, (Instant, Pending)>>,
}

impl TokenCache {
    pub(crate) fn new(ttl: Duration, max: usize) -> Self {
        TokenCache {
            ttl,
            max,
            map: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn insert(&self, req: Pending) -> Result<String, Error> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if map.len() >= self.max {
            map.retain(|_, (expires, _)| *expires > now);
        }
        if map.len() >= self.max {
            return Err(Error::ResourceExhausted(self.max));
        }
        loop {
            let mut raw = [0u8; 16];
            getrandom::fill(&mut raw)
                .map_err(|e| Error::Config(format!("no randomness for tokens: {e}")))?;
            let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
            if !map.contains_key(&token) {
                map.insert(token.clone(), (now + self.ttl, req));
                return Ok(token);
            }
        }
    }

    /// Takes the request a token stands for: a token works once, and not
    /// after it expired.
    pub(crate) fn consume(&self, token: &str) -> Option<Pending> {
        if token.len() != TOKEN_LEN
            || !token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return None;
        }
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let (expires, req) = map.remove(token)?;
        (expires > Instant::now()).then_some(req)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> Pending {
        Pending::PortForward(PortForwardRequest {
            pod_sandbox_id: "p".into(),
            ports: vec![],
        })
    }

    #[test]
    fn tokens_are_single_use_and_random() {
        let c = TokenCache::new(Duration::from_secs(60), 10);
        let a = c.insert(req()).unwrap();
        let b = c.insert(req()).unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), TOKEN_LEN);
        assert_eq!(c.consume(&a), Some(req()));
        assert_eq!(c.consume(&a), None);
        assert_eq!(c.consume("not-a-token"), None);
        assert_eq!(c.consume("../../../../etc/passwd!"), None);
        assert!(c.consume(&b).is_some());
    }

    #[test]
    fn expired_tokens_are_refused_and_collected() {
        let c = TokenCache::new(Duration::from_millis(0), 2);
        let a = c.insert(req()).unwrap();
        assert_eq!(c.consume(&a), None);
        c.insert(req()).unwrap();
        c.insert(req()).unwrap();
        // Full of expired tokens: they are swept to make room.
        c.insert(req()).unwrap();
        assert!(c.len() <= 2);
    }

    #[test]
    fn outstanding_tokens_are_bounded() {
        let c = TokenCache::new(Duration::from_secs(60), 3);
        for _ in 0..3 {
            c.insert(req()).unwrap();
        }
        assert!(matches!(c.insert(req()), Err(Error::ResourceExhausted(3))));
    }
}
