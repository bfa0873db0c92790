//! Authentication against real registries (htpasswd basic auth, token auth
//! with a token server the test runs) and registry mirrors from hosts.toml.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use base64::Engine as _;
use common::*;
use crust_image::{Credentials, ErrorKind};

#[tokio::test(flavor = "multi_thread")]
async fn basic_auth_with_username_password_or_auth() {
    let reg = Registry::start_with(RegistryAuth::Basic {
        user: "alice".into(),
        password: "s3cret".into(),
    });
    let img = build(ImageSpec::default());
    Pusher::new(&reg)
        .with_basic("alice", "s3cret")
        .image("private/img", "v1", &img)
        .await;
    let s = store().await;
    let reference = format!("{}/private/img:v1", reg.host);

    let err = s.svc.pull(&reference, &anon()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthenticated, "{err}");
    let wrong = Credentials {
        username: "alice".into(),
        password: "nope".into(),
        ..anon()
    };
    let err = s.svc.pull(&reference, &wrong).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthenticated, "{err}");

    let right = Credentials {
        username: "alice".into(),
        password: "s3cret".into(),
        ..anon()
    };
    assert_eq!(s.svc.pull(&reference, &right).await.unwrap().id, img.id());
    assert!(s.svc.remove(&reference).await.unwrap());

    let encoded = Credentials {
        auth: base64::engine::general_purpose::STANDARD.encode("alice:s3cret"),
        ..anon()
    };
    assert_eq!(s.svc.pull(&reference, &encoded).await.unwrap().id, img.id());

    // Credentials for another server are not sent here.
    let elsewhere = Credentials {
        server_address: "other.example.com".into(),
        ..right
    };
    s.svc.remove(&reference).await.unwrap();
    let err = s.svc.pull(&reference, &elsewhere).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthenticated, "{err}");
}

const SERVICE: &str = "crust-test-registry";
const ISSUER: &str = "crust-test-issuer";
const REFRESH_TOKEN: &str = "refresh-me";

/// A token server for docker-registry's `auth: token`: signs ES256 JWTs
/// with a self-signed key whose certificate the registry trusts.
struct TokenServer {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    signer: Arc<Signer>,
}

struct Signer {
    key: aws_lc_rs::signature::EcdsaKeyPair,
    cert_der: Vec<u8>,
}

impl Signer {
    fn new(dir: &std::path::Path) -> (Signer, std::path::PathBuf) {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let params = rcgen::CertificateParams::new(vec!["crust-token-issuer".into()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        let bundle = dir.join("token-ca.pem");
        std::fs::write(&bundle, cert.pem()).unwrap();
        let key = aws_lc_rs::signature::EcdsaKeyPair::from_pkcs8(
            &aws_lc_rs::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &key.serialize_der(),
        )
        .unwrap();
        let signer = Signer {
            key,
            cert_der: cert.der().to_vec(),
        };
        (signer, bundle)
    }

    /// A registry token for `scope` (`repository:NAME:ACTIONS`).
    fn token(&self, scope: &str) -> String {
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let x5c = base64::engine::general_purpose::STANDARD.encode(&self.cert_der);
        let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "x5c": [x5c]});
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let access: Vec<serde_json::Value> = scope
            .split(' ')
            .filter_map(|s| {
                let mut parts = s.splitn(3, ':');
                let (kind, name, actions) = (parts.next()?, parts.next()?, parts.next()?);
                Some(serde_json::json!({"type": kind, "name": name,
                    "actions": actions.split(',').collect::<Vec<_>>()}))
            })
            .collect();
        let claims = serde_json::json!({
            "iss": ISSUER, "sub": "tester", "aud": SERVICE,
            "exp": now + 600, "nbf": now - 60, "iat": now - 60,
            "jti": format!("{now}-{}", rand_suffix()), "access": access,
        });
        let signing_input = format!(
            "{}.{}",
            b64(&serde_json::to_vec(&header).unwrap()),
            b64(&serde_json::to_vec(&claims).unwrap())
        );
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let sig = self.key.sign(&rng, signing_input.as_bytes()).unwrap();
        format!("{signing_input}.{}", b64(sig.as_ref()))
    }
}

fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

impl TokenServer {
    fn start(signer: Signer, user: &'static str, password: &'static str) -> TokenServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let signer = Arc::new(signer);
        let (stop2, signer2) = (stop.clone(), signer.clone());
        let thread = std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let _ = serve_token(conn, &signer2, user, password);
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
                }
            }
        });
        TokenServer {
            port,
            stop,
            thread: Some(thread),
            signer,
        }
    }

    fn realm(&self) -> String {
        format!("http://127.0.0.1:{}/token", self.port)
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Docker's token protocol: GET with basic auth (or anonymous: refused),
/// or an OAuth2 POST with grant_type=refresh_token.
fn serve_token(
    conn: TcpStream,
    signer: &Signer,
    user: &str,
    password: &str,
) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        if line.trim().is_empty() {
            break;
        }
        headers.push(line.trim().to_string());
    }
    let header = |name: &str| {
        headers.iter().find_map(|h| {
            let (k, v) = h.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    };
    let len: usize = header("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body)?;
    let target = request_line.split(' ').nth(1).unwrap_or("");
    let query = target.split_once('?').map_or("", |(_, q)| q);
    let params: Vec<(String, String)> = if request_line.starts_with("POST") {
        form(std::str::from_utf8(&body).unwrap_or(""))
    } else {
        form(query)
    };
    let param = |k: &str| {
        params
            .iter()
            .find(|(pk, _)| pk == k)
            .map(|(_, v)| v.clone())
    };
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    );
    let allowed = if request_line.starts_with("POST") {
        param("grant_type").as_deref() == Some("refresh_token")
            && param("refresh_token").as_deref() == Some(REFRESH_TOKEN)
    } else {
        header("authorization").as_deref() == Some(basic.as_str())
    };
    let mut out = conn;
    if !allowed {
        let body = r#"{"errors":[{"code":"UNAUTHORIZED","message":"bad credentials"}]}"#;
        return write!(
            out,
            "HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
    let scope = param("scope").unwrap_or_default();
    let token = signer.token(&scope);
    let body =
        serde_json::json!({"token": token, "access_token": token, "expires_in": 600}).to_string();
    write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn form(s: &str) -> Vec<(String, String)> {
    s.split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (decode(k), decode(v)))
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("00");
                out.push(u8::from_str_radix(hex, 16).unwrap_or(b'?'));
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn token_auth_with_password_registry_token_and_identity_token() {
    let dir = tempfile::tempdir().unwrap();
    let (signer, bundle) = Signer::new(dir.path());
    let tokens = TokenServer::start(signer, "bob", "hunter2");
    let reg = Registry::start_with(RegistryAuth::Token {
        realm: tokens.realm(),
        service: SERVICE.into(),
        issuer: ISSUER.into(),
        rootcertbundle: bundle,
    });
    let img = build(ImageSpec::default());
    let push_token = tokens.signer.token("repository:secure/img:pull,push");
    Pusher::new(&reg)
        .with_bearer(&push_token)
        .image("secure/img", "v1", &img)
        .await;
    let s = store().await;
    let reference = format!("{}/secure/img:v1", reg.host);

    let err = s.svc.pull(&reference, &anon()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthenticated, "{err}");

    // Username/password, exchanged for a token by oci-client.
    let password = Credentials {
        username: "bob".into(),
        password: "hunter2".into(),
        ..anon()
    };
    assert_eq!(
        s.svc.pull(&reference, &password).await.unwrap().id,
        img.id()
    );
    s.svc.remove(&reference).await.unwrap();

    // CRI registry_token: a bearer token sent as is.
    let registry_token = Credentials {
        registry_token: tokens.signer.token("repository:secure/img:pull"),
        ..anon()
    };
    assert_eq!(
        s.svc.pull(&reference, &registry_token).await.unwrap().id,
        img.id()
    );
    s.svc.remove(&reference).await.unwrap();

    // CRI identity_token: an OAuth2 refresh token crust exchanges itself.
    let identity = Credentials {
        identity_token: REFRESH_TOKEN.into(),
        ..anon()
    };
    assert_eq!(
        s.svc.pull(&reference, &identity).await.unwrap().id,
        img.id()
    );
    s.svc.remove(&reference).await.unwrap();
    let bad_identity = Credentials {
        identity_token: "stolen".into(),
        ..anon()
    };
    let err = s.svc.pull(&reference, &bad_identity).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthenticated, "{err}");
    assert!(err.to_string().contains("identity token"), "{err}");
}

fn hosts_dir(entries: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (host, toml) in entries {
        let d = dir.path().join(host);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("hosts.toml"), toml).unwrap();
    }
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn registry_k8s_io_through_a_configured_mirror() {
    let reg = Registry::start();
    let img = build(ImageSpec::default());
    Pusher::new(&reg)
        .image("e2e-test-images/busybox", "1.29-2", &img)
        .await;
    // The same shape as shared/tools/certs.d/registry.k8s.io/hosts.toml.
    let config = format!(
        "server = \"http://{0}\"\n\n[host.\"http://{0}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
        reg.host
    );
    let hosts = hosts_dir(&[("registry.k8s.io", &config)]);
    let s = store_with(Some(hosts.path())).await;
    let reference = "registry.k8s.io/e2e-test-images/busybox:1.29-2";
    let got = s.svc.pull(reference, &anon()).await.unwrap();
    assert_eq!(got.id, img.id());
    assert_eq!(got.repo_tags, vec![reference.to_string()]);
    assert_eq!(
        got.repo_digests,
        vec![format!(
            "registry.k8s.io/e2e-test-images/busybox@{}",
            img.manifest_digest()
        )]
    );
    assert!(s.svc.get(reference).unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn mirrors_are_tried_in_order_and_capabilities_respected() {
    let mirror = Registry::start();
    let upstream = Registry::start();
    let img = build(ImageSpec::default());
    let other = build(ImageSpec {
        user: "upstream-only",
        ..ImageSpec::default()
    });
    Pusher::new(&mirror).image("lib/img", "1", &img).await;
    Pusher::new(&upstream).image("lib/img", "2", &other).await;
    let dead = free_port();
    let config = format!(
        "server = \"http://{up}\"\n\
         [host.\"http://127.0.0.1:{dead}\"]\n  capabilities = [\"pull\", \"resolve\"]\n\
         [host.\"http://{mirror}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
        up = upstream.host,
        mirror = mirror.host
    );
    let hosts = hosts_dir(&[("example.com", &config)]);
    let s = store_with(Some(hosts.path())).await;
    // A dead mirror is skipped; the live one serves tag 1.
    let got = s.svc.pull("example.com/lib/img:1", &anon()).await.unwrap();
    assert_eq!(got.id, img.id());
    // Tag 2 is only upstream: both mirrors miss, the server has it.
    let got = s.svc.pull("example.com/lib/img:2", &anon()).await.unwrap();
    assert_eq!(got.id, other.id());

    // A pull-only mirror is not asked to resolve tags.
    let config = format!(
        "server = \"http://127.0.0.1:{dead}\"\n[host.\"http://{}\"]\n  capabilities = [\"pull\"]\n",
        mirror.host
    );
    let hosts = hosts_dir(&[("pullonly.example.com", &config)]);
    let s = store_with(Some(hosts.path())).await;
    let err = s
        .svc
        .pull("pullonly.example.com/lib/img:1", &anon())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    // ... but serves content by digest.
    let by_digest = format!("pullonly.example.com/lib/img@{}", img.manifest_digest());
    assert_eq!(s.svc.pull(&by_digest, &anon()).await.unwrap().id, img.id());
}
