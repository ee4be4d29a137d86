//! Credential custody for PostgreSQL: the forwarder logs in to the server
//! with the connector's password and hands the sandbox an already
//! authenticated session. The client on the sandbox side is told only
//! "authentication ok"; no password or verifier ever reaches it.
//!
//! Whatever answers on the network is hostile until proven otherwise, so
//! the password goes only where it must:
//! - TLS toward the server by default, verified against the CA the
//!   Connector names (else the public web PKI) and the server's name; a
//!   server that does not speak TLS is refused. Plain TCP only where the
//!   Connector says so.
//! - SCRAM-SHA-256 only by default (the server learns nothing it could
//!   replay), with channel binding (SCRAM-SHA-256-PLUS, tls-server-end-point)
//!   whenever the server offers it over TLS; md5 and cleartext are answered
//!   only where the Connector allows them.
//! - A SCRAM login is complete only when the server has proven it knows the
//!   verifier: an "ok" before that is refused.
//!
//! The same shape fits other protocols (an HTTP forwarder adding an
//! `Authorization` header for GitHub): a handshake run between accepting
//! the sandbox's connection and splicing it to the upstream one.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha384, Sha512};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_rustls::rustls::{self, pki_types::ServerName};

use crate::hashing::{salted_password, HashBudget};

/// The whole login may take this long.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);
/// Largest startup packet or authentication message accepted.
const MAX_MESSAGE: usize = 16 * 1024;
const PROTOCOL_3: u32 = 196_608;
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;
const CANCEL_REQUEST: u32 = 80_877_102;

/// Password methods weaker than SCRAM-SHA-256 that a connector may allow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WeakMethods {
    /// md5: the server learns a hash it can replay to itself.
    pub md5: bool,
    /// Cleartext: the server learns the password.
    pub cleartext: bool,
}

/// TLS toward the server.
#[derive(Clone)]
pub struct PgTls {
    config: Arc<rustls::ClientConfig>,
    server_name: ServerName<'static>,
    /// The CA bundle it was built from (`None`: the public web PKI).
    ca_pem: Option<String>,
}

impl PartialEq for PgTls {
    fn eq(&self, other: &PgTls) -> bool {
        self.server_name == other.server_name && self.ca_pem == other.ca_pem
    }
}

impl Eq for PgTls {}

impl std::fmt::Debug for PgTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgTls {{ server_name: {:?} }}", self.server_name)
    }
}

impl PgTls {
    /// Verification against the CAs in `ca_pem` (none: the public web PKI)
    /// for the name `server_name`. The error says what is wrong with either.
    pub fn new(ca_pem: Option<&str>, server_name: &str) -> Result<PgTls, String> {
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        let mut roots = rustls::RootCertStore::empty();
        match ca_pem {
            None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                    let cert = cert.map_err(|e| format!("the CA bundle is not PEM ({e})"))?;
                    roots.add(cert).map_err(|e| format!("a CA certificate is not usable ({e})"))?;
                }
                if roots.is_empty() {
                    return Err("the CA bundle holds no certificate".into());
                }
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server_name = ServerName::try_from(server_name.to_string()).map_err(|_| format!("{server_name:?} is not a server name TLS can verify"))?;
        Ok(PgTls { config: Arc::new(config), server_name, ca_pem: ca_pem.map(str::to_string) })
    }
}

/// What the forwarder logs in with.
#[derive(Clone)]
pub struct PgLogin {
    /// Role.
    pub user: String,
    /// Its password (kept in the agent's memory only).
    pub password: String,
    /// Database when the client names none.
    pub database: Option<String>,
    /// Weaker methods the connector allows.
    pub weak: WeakMethods,
    /// TLS toward the server (`None`: plain TCP, as the connector chose).
    pub tls: Option<PgTls>,
    /// What SCRAM hashing this sandbox may still cost the agent.
    pub hashing: Arc<HashBudget>,
}

impl std::fmt::Debug for PgLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgLogin {{ user: {:?}, password: <redacted>, weak: {:?}, tls: {:?} }}", self.user, self.weak, self.tls)
    }
}

/// What the sandbox's client asked for.
#[derive(Debug, PartialEq, Eq)]
pub enum Startup {
    /// A session with these startup parameters.
    Session(Vec<(String, String)>),
    /// A cancel request (its packet, passed on as it is).
    Cancel(Vec<u8>),
}

fn protocol(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Reads the sandbox client's startup (declining its TLS: the sandbox leg
/// is loopback inside the sandbox).
pub async fn client_startup<C: AsyncRead + AsyncWrite + Unpin>(client: &mut C) -> io::Result<Startup> {
    loop {
        let packet = read_startup(client).await?;
        let code = u32::from_be_bytes(packet[0..4].try_into().map_err(|_| protocol("short startup packet"))?);
        match code {
            SSL_REQUEST | GSSENC_REQUEST => client.write_all(b"N").await?,
            CANCEL_REQUEST => return Ok(Startup::Cancel(packet)),
            PROTOCOL_3 => return Ok(Startup::Session(parse_params(&packet[4..])?)),
            other => {
                let _ = client.write_all(&error_response(&format!("unsupported protocol {other}"))).await;
                return Err(protocol(format!("startup code {other}")));
            }
        }
    }
}

/// Tells the sandbox's client why its connection ends (never a secret).
pub async fn tell_client<C: AsyncWrite + Unpin>(client: &mut C, why: &str) {
    let _ = client.write_all(&error_response(why)).await;
}

/// TLS with the server (PostgreSQL's SSLRequest, then the handshake):
/// the stream and the channel-binding data of the certificate it showed.
pub async fn start_tls<S>(mut server: S, tls: &PgTls) -> io::Result<(tokio_rustls::client::TlsStream<S>, Vec<u8>)>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    server.write_all(&framed_startup(&SSL_REQUEST.to_be_bytes())).await?;
    // Exactly one byte: anything the server sent after it is TLS or nothing
    // (bytes injected before the handshake are not read as PostgreSQL).
    match server.read_u8().await? {
        b'S' => {}
        b'N' => return Err(refused("the server does not offer TLS, and the connector requires it")),
        _ => return Err(protocol("the server's answer to SSLRequest is not PostgreSQL")),
    }
    let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
    let stream = connector.connect(tls.server_name.clone(), server).await.map_err(|e| refused(format!("TLS with the server failed: {e}")))?;
    let leaf = stream.get_ref().1.peer_certificates().and_then(|c| c.first()).ok_or_else(|| refused("the server showed no certificate"))?;
    let binding = end_point_binding(leaf.as_ref());
    Ok((stream, binding))
}

fn refused(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, why.into())
}

/// How the client's session was handed over.
#[derive(Debug, PartialEq, Eq)]
pub enum Handshake {
    /// Logged in: splice the two connections.
    Session,
    /// A cancel request was passed on: splice until the server closes.
    Cancel,
}

/// Logs in to `server` for the client's `startup`. `binding` is the TLS
/// channel-binding data when `server` is a TLS stream.
// Long: the PostgreSQL authentication exchange as one state machine (SCRAM, its proof and channel binding, and the refusals), read top to bottom.
pub async fn pg_login<C, S>(client: &mut C, server: &mut S, login: &PgLogin, startup: Startup, binding: Option<&[u8]>) -> io::Result<Handshake>
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let params = match startup {
        Startup::Cancel(packet) => {
            server.write_all(&framed_startup(&packet)).await?;
            return Ok(Handshake::Cancel);
        }
        Startup::Session(params) => params,
    };
    server.write_all(&self::startup(&params, login)).await?;
    let mut scram: Option<Scram> = None;
    let mut proven = false;
    loop {
        let (kind, body) = read_message(server).await?;
        match kind {
            b'R' => {
                let code = body.get(0..4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])).ok_or_else(|| protocol("short authentication message"))?;
                let rest = &body[4..];
                match code {
                    0 if scram.is_some() && !proven => return refuse(client, "the server said ok without proving it knows the password (SCRAM signature missing)").await,
                    0 => {
                        client.write_all(&message(b'R', &0u32.to_be_bytes())).await?;
                        return Ok(Handshake::Session);
                    }
                    3 if !login.weak.cleartext => return refuse(client, "the server asks for the password in cleartext, which the connector does not allow").await,
                    3 => server.write_all(&password_message(login.password.as_bytes())).await?,
                    5 if !login.weak.md5 => return refuse(client, "the server asks for an md5 password, which the connector does not allow (SCRAM-SHA-256 only)").await,
                    5 => {
                        let salt: [u8; 4] = rest.get(0..4).and_then(|s| s.try_into().ok()).ok_or_else(|| protocol("short md5 salt"))?;
                        server.write_all(&password_message(md5_password(&login.user, &login.password, salt).as_bytes())).await?;
                    }
                    10 if scram.is_some() => return Err(protocol("a second SASL start")),
                    10 => {
                        let offered: Vec<&[u8]> = rest.split(|b| *b == 0).filter(|m| !m.is_empty()).collect();
                        let Some((mechanism, s)) = Scram::choose(&offered, binding) else {
                            return refuse(client, "the server offers no SASL mechanism the forwarder speaks (SCRAM-SHA-256)").await;
                        };
                        let first = s.client_first();
                        let mut payload = format!("{mechanism}\0").into_bytes();
                        payload.extend_from_slice(&(first.len() as u32).to_be_bytes());
                        payload.extend_from_slice(first.as_bytes());
                        server.write_all(&message(b'p', &payload)).await?;
                        scram = Some(s);
                    }
                    11 => {
                        let s = scram.as_mut().ok_or_else(|| protocol("SASL continue before SASL start"))?;
                        let server_first = std::str::from_utf8(rest).map_err(|_| protocol("server-first-message is not UTF-8"))?;
                        let challenge = s.challenge(server_first).map_err(protocol)?;
                        let salted = match salted_password(&login.password, &challenge.salt, challenge.iterations, &login.hashing).await {
                            Ok(salted) => salted,
                            Err(why) => return refuse(client, &why).await,
                        };
                        let fin = s.client_final(server_first, &challenge, &salted);
                        server.write_all(&message(b'p', fin.as_bytes())).await?;
                    }
                    12 => {
                        let s = scram.as_ref().ok_or_else(|| protocol("SASL final before SASL start"))?;
                        let server_final = std::str::from_utf8(rest).map_err(|_| protocol("server-final-message is not UTF-8"))?;
                        if !s.verify_server(server_final) {
                            return refuse(client, "the server's SCRAM signature does not match: not the server the connector names").await;
                        }
                        proven = true;
                    }
                    other => return refuse(client, &format!("the server asks for an authentication method the forwarder does not speak ({other})")).await,
                }
            }
            // The server refused the login: the client sees why (it names no secret).
            b'E' => {
                client.write_all(&message(b'E', &body)).await?;
                return Err(protocol("the server refused the login"));
            }
            b'N' => {}
            other => return Err(protocol(format!("unexpected message {:?} during login", other as char))),
        }
    }
}

async fn refuse<C: AsyncWrite + Unpin>(client: &mut C, why: &str) -> io::Result<Handshake> {
    let _ = client.write_all(&error_response(why)).await;
    Err(refused(why))
}

async fn read_startup<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Vec<u8>> {
    let len = r.read_u32().await? as usize;
    if !(8..=MAX_MESSAGE).contains(&len) {
        return Err(protocol(format!("startup packet of {len} bytes")));
    }
    let mut body = vec![0u8; len - 4];
    r.read_exact(&mut body).await?;
    Ok(body)
}

async fn read_message<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<(u8, Vec<u8>)> {
    let kind = r.read_u8().await?;
    let len = r.read_u32().await? as usize;
    if !(4..=MAX_MESSAGE).contains(&len) {
        return Err(protocol(format!("message of {len} bytes during login")));
    }
    let mut body = vec![0u8; len - 4];
    r.read_exact(&mut body).await?;
    Ok((kind, body))
}

fn framed_startup(body: &[u8]) -> Vec<u8> {
    let mut m = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    m.extend_from_slice(body);
    m
}

fn message(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![kind];
    m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

fn password_message(password: &[u8]) -> Vec<u8> {
    let mut body = password.to_vec();
    body.push(0);
    message(b'p', &body)
}

fn error_response(why: &str) -> Vec<u8> {
    let mut body = Vec::new();
    for (field, value) in [(b'S', "FATAL"), (b'V', "FATAL"), (b'C', "28000"), (b'M', why)] {
        body.push(field);
        body.extend_from_slice(value.replace('\0', " ").as_bytes());
        body.push(0);
    }
    body.push(0);
    message(b'E', &body)
}

/// Startup parameters (name, value) of a v3 startup packet body.
fn parse_params(body: &[u8]) -> io::Result<Vec<(String, String)>> {
    let mut parts = body.split(|b| *b == 0);
    let mut out = Vec::new();
    loop {
        let Some(name) = parts.next() else { break };
        if name.is_empty() {
            break;
        }
        let value = parts.next().ok_or_else(|| protocol("startup parameter without a value"))?;
        let text = |b: &[u8]| String::from_utf8(b.to_vec()).map_err(|_| protocol("startup parameter is not UTF-8"));
        out.push((text(name)?, text(value)?));
        if out.len() > 64 {
            return Err(protocol("too many startup parameters"));
        }
    }
    Ok(out)
}

/// The startup packet sent upstream: the client's parameters, with the
/// connector's role (whatever the client said) and a database.
fn startup(params: &[(String, String)], login: &PgLogin) -> Vec<u8> {
    let mut body = PROTOCOL_3.to_be_bytes().to_vec();
    let mut push = |k: &str, v: &str| {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    };
    push("user", &login.user);
    let database = params.iter().find(|(k, _)| k == "database").map(|(_, v)| v.clone()).or_else(|| login.database.clone()).unwrap_or_else(|| login.user.clone());
    push("database", &database);
    for (k, v) in params.iter().filter(|(k, _)| k != "user" && k != "database") {
        push(k, v);
    }
    body.push(0);
    framed_startup(&body)
}

fn md5_password(user: &str, password: &str, salt: [u8; 4]) -> String {
    let hex = |d: &[u8]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let inner = hex(&md5::Md5::digest(format!("{password}{user}").as_bytes()));
    let mut outer = inner.into_bytes();
    outer.extend_from_slice(&salt);
    format!("md5{}", hex(&md5::Md5::digest(&outer)))
}

type HmacSha256 = Hmac<Sha256>;

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut m = <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(data);
    m.finalize().into_bytes().into()
}

/// What the server-first-message asks: the combined nonce, the salt, the
/// PBKDF2 iteration count.
struct Challenge {
    nonce: String,
    salt: Vec<u8>,
    iterations: u32,
}

/// The client side of SCRAM-SHA-256 (RFC 5802/7677), with channel binding
/// (RFC 5929 tls-server-end-point, as PostgreSQL speaks it) when on TLS.
struct Scram {
    nonce: String,
    /// GS2 header: `n,,` (no TLS), `y,,` (TLS, but the server offered no
    /// binding: a server that did would see the downgrade), or
    /// `p=tls-server-end-point,,`.
    gs2: &'static str,
    binding: Vec<u8>,
    auth_message: String,
    server_signature: [u8; 32],
}

impl Scram {
    /// The mechanism to use among `offered`, and its state.
    fn choose(offered: &[&[u8]], tls_binding: Option<&[u8]>) -> Option<(&'static str, Scram)> {
        let has = |m: &str| offered.contains(&m.as_bytes());
        let nonce = base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 18]>());
        match tls_binding {
            Some(b) if has("SCRAM-SHA-256-PLUS") => Some(("SCRAM-SHA-256-PLUS", Scram::with_nonce(nonce, "p=tls-server-end-point,,", b.to_vec()))),
            Some(_) if has("SCRAM-SHA-256") => Some(("SCRAM-SHA-256", Scram::with_nonce(nonce, "y,,", Vec::new()))),
            None if has("SCRAM-SHA-256") => Some(("SCRAM-SHA-256", Scram::with_nonce(nonce, "n,,", Vec::new()))),
            _ => None,
        }
    }

    fn with_nonce(nonce: String, gs2: &'static str, binding: Vec<u8>) -> Scram {
        Scram { nonce, gs2, binding, auth_message: String::new(), server_signature: [0; 32] }
    }

    fn client_first(&self) -> String {
        format!("{}n=,r={}", self.gs2, self.nonce)
    }

    /// The server-first-message read: its nonce must extend ours.
    fn challenge(&self, server_first: &str) -> Result<Challenge, String> {
        let attr = |k: &str| server_first.split(',').find_map(|p| p.strip_prefix(k)).ok_or(format!("server-first-message lacks {k}"));
        let nonce = attr("r=")?;
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err("the server's nonce does not extend ours".into());
        }
        let salt = base64::engine::general_purpose::STANDARD.decode(attr("s=")?).map_err(|_| "salt is not base64".to_string())?;
        let iterations: u32 = attr("i=")?.parse().map_err(|_| "iteration count is not a number".to_string())?;
        Ok(Challenge { nonce: nonce.to_string(), salt, iterations })
    }

    /// The client-final-message, from the password salted as `challenge` asked.
    fn client_final(&mut self, server_first: &str, challenge: &Challenge, salted: &[u8; 32]) -> String {
        let nonce = &challenge.nonce;
        let client_key = hmac(salted, b"Client Key");
        let stored_key: [u8; 32] = Sha256::digest(client_key).into();
        let mut cbind = self.gs2.as_bytes().to_vec();
        cbind.extend_from_slice(&self.binding);
        let without_proof = format!("c={},r={nonce}", base64::engine::general_purpose::STANDARD.encode(cbind));
        self.auth_message = format!("n=,r={},{server_first},{without_proof}", self.nonce);
        let signature = hmac(&stored_key, self.auth_message.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(signature.iter()).map(|(a, b)| a ^ b).collect();
        self.server_signature = hmac(&hmac(salted, b"Server Key"), self.auth_message.as_bytes());
        format!("{without_proof},p={}", base64::engine::general_purpose::STANDARD.encode(proof))
    }

    fn verify_server(&self, server_final: &str) -> bool {
        let Some(v) = server_final.split(',').find_map(|p| p.strip_prefix("v=")) else { return false };
        base64::engine::general_purpose::STANDARD.decode(v).is_ok_and(|sig| sig.len() == 32 && sig.iter().zip(self.server_signature.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0)
    }
}

/// RFC 5929 tls-server-end-point: the certificate hashed with its signature
/// algorithm's hash, SHA-256 for MD5, SHA-1 and whatever is not recognised
/// (as PostgreSQL's server computes it for the certificates it can serve).
fn end_point_binding(der: &[u8]) -> Vec<u8> {
    const SHA384: [&[u8]; 2] = [
        &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0c], // sha384WithRSAEncryption
        &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x03],       // ecdsa-with-SHA384
    ];
    const SHA512: [&[u8]; 2] = [
        &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0d], // sha512WithRSAEncryption
        &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x04, 0x03, 0x04],       // ecdsa-with-SHA512
    ];
    match signature_algorithm(der) {
        Some(oid) if SHA384.contains(&oid) => Sha384::digest(der).to_vec(),
        Some(oid) if SHA512.contains(&oid) => Sha512::digest(der).to_vec(),
        _ => Sha256::digest(der).to_vec(),
    }
}

/// The OID of a DER certificate's `signatureAlgorithm` (the SEQUENCE after
/// `tbsCertificate`).
fn signature_algorithm(der: &[u8]) -> Option<&[u8]> {
    let (_, cert) = der_element(der, 0x30)?;
    let (after_tbs, _) = der_element(cert, 0x30)?;
    let (_, algorithm) = der_element(after_tbs, 0x30)?;
    der_element(algorithm, 0x06).map(|(_, oid)| oid)
}

/// The DER element at the start of `data` with tag `tag`: (what follows
/// it, its contents).
fn der_element(data: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    if *data.first()? != tag {
        return None;
    }
    let first = *data.get(1)? as usize;
    let (len, header) = if first < 0x80 {
        (first, 2)
    } else {
        let n = first & 0x7f;
        if n == 0 || n > 4 {
            return None;
        }
        let len = data.get(2..2 + n)?.iter().fold(0usize, |acc, b| (acc << 8) | *b as usize);
        (len, 2 + n)
    };
    let contents = data.get(header..header.checked_add(len)?)?;
    Some((&data[header + len..], contents))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scram_matches_the_rfc_7677_example() {
        // RFC 7677 §3 (user "user", password "pencil"); PostgreSQL sends an
        // empty n=, so the auth message differs only in that attribute.
        let mut s = Scram::with_nonce("rOprNGfwEbeRWgbNEkqO".into(), "n,,", Vec::new());
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let challenge = s.challenge(server_first).unwrap();
        assert_eq!(challenge.iterations, 4096);
        let mut salted = [0u8; 32];
        pbkdf2::pbkdf2_hmac::<Sha256>(b"pencil", &challenge.salt, 4096, &mut salted);
        let fin = s.client_final(server_first, &challenge, &salted);
        assert!(fin.starts_with("c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p="), "{fin}");
        // Recompute the RFC's own auth message (n=user) to check the maths.
        let mut rfc = Scram::with_nonce("rOprNGfwEbeRWgbNEkqO".into(), "n,,", Vec::new());
        let _ = rfc.client_final(server_first, &challenge, &salted);
        rfc.auth_message = rfc.auth_message.replacen("n=,", "n=user,", 1);
        let client_key = hmac(&salted, b"Client Key");
        let stored: [u8; 32] = Sha256::digest(client_key).into();
        let sig = hmac(&stored, rfc.auth_message.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(sig.iter()).map(|(a, b)| a ^ b).collect();
        assert_eq!(base64::engine::general_purpose::STANDARD.encode(proof), "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=");
        let server = hmac(&hmac(&salted, b"Server Key"), rfc.auth_message.as_bytes());
        assert_eq!(base64::engine::general_purpose::STANDARD.encode(server), "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
        assert!(!s.verify_server("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="), "a signature for another auth message fails");
    }

    #[test]
    fn scram_refuses_a_nonce_it_did_not_start() {
        let s = Scram::with_nonce("abc".into(), "n,,", Vec::new());
        assert!(s.challenge("r=xyz123,s=AAAA,i=4096").is_err());
        assert!(s.challenge("r=abc,s=AAAA,i=4096").is_err(), "the server must add to the nonce");
        assert!(s.challenge("r=abcdef,s=AAAA,i=x").is_err());
        assert_eq!(s.challenge("r=abcdef,s=AAAA,i=4096").unwrap().iterations, 4096);
    }

    #[test]
    fn md5_matches_postgres() {
        // 'md5' || md5(md5('secret' || 'alice') || salt), computed independently.
        assert_eq!(md5_password("alice", "secret", [1, 2, 3, 4]), "md598a0412b9c31436fc53776e863350083");
    }

    #[test]
    fn the_upstream_startup_carries_the_connectors_role() {
        let login = PgLogin { user: "agent".into(), password: "x".into(), database: Some("app".into()), weak: WeakMethods::default(), tls: None, hashing: Arc::default() };
        let params = vec![("user".to_string(), "sandbox".to_string()), ("application_name".to_string(), "psql".to_string())];
        let packet = startup(&params, &login);
        let body = &packet[8..];
        assert_eq!(parse_params(body).unwrap(), [("user".into(), "agent".into()), ("database".into(), "app".into()), ("application_name".into(), "psql".into())]);
        assert!(parse_params(b"user").is_err(), "a name without a value");
    }

    /// A client that asks for TLS (declined), then a session as `sandbox`.
    async fn sandbox_client(client: &mut tokio::io::DuplexStream) {
        client.write_all(&framed_startup(&SSL_REQUEST.to_be_bytes())).await.unwrap();
        let mut n = [0u8; 1];
        client.read_exact(&mut n).await.unwrap();
        assert_eq!(&n, b"N");
        let mut body = PROTOCOL_3.to_be_bytes().to_vec();
        body.extend_from_slice(b"user\0sandbox\0\0");
        client.write_all(&framed_startup(&body)).await.unwrap();
    }

    fn login(weak: WeakMethods) -> PgLogin {
        PgLogin { user: "agent".into(), password: "hunter2".into(), database: None, weak, tls: None, hashing: Arc::default() }
    }

    /// Runs the forwarder's side against `server`, a script of the server.
    async fn forward<F: std::future::Future<Output = ()>>(login: PgLogin, server: impl FnOnce(tokio::io::DuplexStream) -> F) -> (io::Result<Handshake>, Vec<u8>) {
        let (mut client, mut client_side) = tokio::io::duplex(4096);
        let (mut server_side, server_end) = tokio::io::duplex(4096);
        let proxy = async {
            let startup = client_startup(&mut client_side).await?;
            let r = pg_login(&mut client_side, &mut server_side, &login, startup, None).await;
            drop(client_side);
            drop(server_side);
            r
        };
        let fake_client = async {
            sandbox_client(&mut client).await;
            let mut got = Vec::new();
            let _ = client.read_to_end(&mut got).await;
            got
        };
        let (r, (), got) = tokio::join!(proxy, server(server_end), fake_client);
        (r, got)
    }

    #[tokio::test]
    async fn a_client_is_told_only_that_authentication_succeeded() {
        let (r, got) = forward(login(WeakMethods { md5: false, cleartext: true }), |mut server| async move {
            let startup = read_startup(&mut server).await.unwrap();
            assert!(parse_params(&startup[4..]).unwrap().contains(&("user".into(), "agent".into())));
            server.write_all(&message(b'R', &[0, 0, 0, 3])).await.unwrap();
            let (kind, body) = read_message(&mut server).await.unwrap();
            assert_eq!((kind, body.as_slice()), (b'p', &b"hunter2\0"[..]));
            server.write_all(&message(b'R', &[0, 0, 0, 0])).await.unwrap();
        })
        .await;
        assert_eq!(r.unwrap(), Handshake::Session);
        assert_eq!(got, message(b'R', &[0, 0, 0, 0]), "no challenge, no password: just ok");
    }

    /// The impostor's question: cleartext or md5. Unless the connector
    /// allows the method, the forwarder answers nothing at all.
    #[tokio::test]
    async fn weak_methods_get_no_answer_unless_the_connector_allows_them() {
        for (code, name) in [(3u8, "cleartext"), (5, "md5")] {
            let (r, got) = forward(login(WeakMethods::default()), |mut server| async move {
                read_startup(&mut server).await.unwrap();
                server.write_all(&message(b'R', &[0, 0, 0, code, 1, 2, 3, 4])).await.unwrap();
                let mut rest = Vec::new();
                server.read_to_end(&mut rest).await.unwrap();
                assert!(rest.is_empty(), "{name}: the forwarder answered {rest:?}");
            })
            .await;
            assert_eq!(r.unwrap_err().kind(), io::ErrorKind::PermissionDenied, "{name}");
            assert!(String::from_utf8_lossy(&got).contains("does not allow"), "{name}: the client is told why: {got:?}");
        }
    }

    /// An impostor that starts SCRAM and then says "ok" without the server
    /// signature (it does not know the verifier) gets no session.
    #[tokio::test]
    async fn scram_ok_without_the_servers_proof_is_refused() {
        let (r, got) = forward(login(WeakMethods::default()), |mut server| async move {
            read_startup(&mut server).await.unwrap();
            server.write_all(&message(b'R', b"\0\0\0\x0aSCRAM-SHA-256\0\0")).await.unwrap();
            let (kind, _) = read_message(&mut server).await.unwrap();
            assert_eq!(kind, b'p');
            server.write_all(&message(b'R', &[0, 0, 0, 0])).await.unwrap();
            let mut rest = Vec::new();
            server.read_to_end(&mut rest).await.unwrap();
        })
        .await;
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        assert!(!got.starts_with(&message(b'R', &[0, 0, 0, 0])), "the client must not get a session");
    }

    #[test]
    fn channel_binding_is_chosen_when_offered_over_tls_and_its_downgrade_is_visible() {
        let plus: [&[u8]; 2] = [b"SCRAM-SHA-256-PLUS", b"SCRAM-SHA-256"];
        let (m, s) = Scram::choose(&plus, Some(b"hash")).unwrap();
        assert_eq!((m, s.gs2), ("SCRAM-SHA-256-PLUS", "p=tls-server-end-point,,"));
        assert!(s.client_first().starts_with("p=tls-server-end-point,,n=,r="));
        let mut s = s;
        let first = format!("r={}x,s=AAAA,i=4096", s.nonce);
        let challenge = s.challenge(&first).unwrap();
        let fin = s.client_final(&first, &challenge, &[0; 32]);
        let c = base64::engine::general_purpose::STANDARD.encode(b"p=tls-server-end-point,,hash");
        assert!(fin.starts_with(&format!("c={c},")), "{fin}");
        let only: [&[u8]; 1] = [b"SCRAM-SHA-256"];
        assert_eq!(Scram::choose(&only, Some(b"hash")).unwrap().1.gs2, "y,,", "on TLS without an offer: say we could have");
        assert_eq!(Scram::choose(&plus, None).unwrap().1.gs2, "n,,");
        let none: [&[u8]; 1] = [b"SCRAM-SHA-1"];
        assert!(Scram::choose(&none, None).is_none());
    }

    #[test]
    fn end_point_binding_hashes_with_the_certificates_signature_hash() {
        for (alg, len) in [(&rcgen::PKCS_ECDSA_P256_SHA256, 32), (&rcgen::PKCS_ECDSA_P384_SHA384, 48)] {
            let key = rcgen::KeyPair::generate_for(alg).unwrap();
            let cert = rcgen::CertificateParams::new(vec!["db.internal".to_string()]).unwrap().self_signed(&key).unwrap();
            let der = cert.der().to_vec();
            assert_eq!(end_point_binding(&der).len(), len);
        }
        assert_eq!(end_point_binding(b"not a certificate").len(), 32);
        assert!(signature_algorithm(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_none(), "lengths beyond the data");
    }

    #[test]
    fn tls_settings_refuse_what_cannot_verify() {
        assert!(PgTls::new(None, "db.internal").is_ok(), "public roots");
        assert!(PgTls::new(Some("no pem here"), "db.internal").unwrap_err().contains("no certificate"));
        assert!(PgTls::new(None, "not a name!").is_err());
    }
}
