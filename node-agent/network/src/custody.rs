//! Credential custody for PostgreSQL: the forwarder logs in to the server
//! with the connector's password (SCRAM-SHA-256, md5 or cleartext, as the
//! server asks) and hands the sandbox an already authenticated session.
//! The client on the sandbox side is told only "authentication ok"; no
//! password or verifier ever reaches it.
//!
//! The same shape fits other protocols (an HTTP forwarder adding an
//! `Authorization` header for GitHub): a handshake run between accepting
//! the sandbox's connection and splicing it to the upstream one.

use std::io;
use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The whole login may take this long.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);
/// Largest startup packet or authentication message accepted.
const MAX_MESSAGE: usize = 16 * 1024;
/// Most PBKDF2 iterations a server may ask for (PostgreSQL uses 4096).
const MAX_ITERATIONS: u32 = 1_000_000;
const PROTOCOL_3: u32 = 196_608;
const SSL_REQUEST: u32 = 80_877_103;
const GSSENC_REQUEST: u32 = 80_877_104;
const CANCEL_REQUEST: u32 = 80_877_102;

/// What the forwarder logs in with.
#[derive(Clone)]
pub struct PgLogin {
    /// Role.
    pub user: String,
    /// Its password (kept in the agent's memory only).
    pub password: String,
    /// Database when the client names none.
    pub database: Option<String>,
}

impl std::fmt::Debug for PgLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgLogin {{ user: {:?}, password: <redacted> }}", self.user)
    }
}

/// How the handshake ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Handshake {
    /// Logged in: splice the two connections.
    Session,
    /// A cancel request was passed on: splice until the server closes.
    Cancel,
}

fn protocol(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Runs the login between `client` (the sandbox) and `server`.
pub async fn pg_login<C, S>(client: &mut C, server: &mut S, login: &PgLogin) -> io::Result<Handshake>
where
    C: AsyncRead + AsyncWrite + Unpin,
    S: AsyncRead + AsyncWrite + Unpin,
{
    let params = loop {
        let packet = read_startup(client).await?;
        let code = u32::from_be_bytes(packet[0..4].try_into().map_err(|_| protocol("short startup packet"))?);
        match code {
            // The sandbox leg is loopback inside the sandbox: no TLS there.
            SSL_REQUEST | GSSENC_REQUEST => client.write_all(b"N").await?,
            CANCEL_REQUEST => {
                server.write_all(&framed_startup(&packet)).await?;
                return Ok(Handshake::Cancel);
            }
            PROTOCOL_3 => break parse_params(&packet[4..])?,
            other => {
                let _ = client.write_all(&error_response(&format!("unsupported protocol {other}"))).await;
                return Err(protocol(format!("startup code {other}")));
            }
        }
    };
    server.write_all(&startup(&params, login)).await?;
    let mut scram: Option<Scram> = None;
    loop {
        let (kind, body) = read_message(server).await?;
        match kind {
            b'R' => {
                let code = body.get(0..4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])).ok_or_else(|| protocol("short authentication message"))?;
                let rest = &body[4..];
                match code {
                    0 => {
                        client.write_all(&message(b'R', &0u32.to_be_bytes())).await?;
                        return Ok(Handshake::Session);
                    }
                    3 => server.write_all(&password_message(login.password.as_bytes())).await?,
                    5 => {
                        let salt: [u8; 4] = rest.get(0..4).and_then(|s| s.try_into().ok()).ok_or_else(|| protocol("short md5 salt"))?;
                        server.write_all(&password_message(md5_password(&login.user, &login.password, salt).as_bytes())).await?;
                    }
                    10 => {
                        let offered: Vec<&[u8]> = rest.split(|b| *b == 0).filter(|m| !m.is_empty()).collect();
                        if !offered.contains(&&b"SCRAM-SHA-256"[..]) {
                            return refuse(client, "the server offers no SASL mechanism the forwarder speaks (SCRAM-SHA-256)").await;
                        }
                        let s = Scram::new();
                        let first = s.client_first();
                        let mut payload = b"SCRAM-SHA-256\0".to_vec();
                        payload.extend_from_slice(&(first.len() as u32).to_be_bytes());
                        payload.extend_from_slice(first.as_bytes());
                        server.write_all(&message(b'p', &payload)).await?;
                        scram = Some(s);
                    }
                    11 => {
                        let s = scram.as_mut().ok_or_else(|| protocol("SASL continue before SASL start"))?;
                        let server_first = std::str::from_utf8(rest).map_err(|_| protocol("server-first-message is not UTF-8"))?;
                        let fin = s.client_final(server_first, &login.password).map_err(protocol)?;
                        server.write_all(&message(b'p', fin.as_bytes())).await?;
                    }
                    12 => {
                        let s = scram.as_ref().ok_or_else(|| protocol("SASL final before SASL start"))?;
                        let server_final = std::str::from_utf8(rest).map_err(|_| protocol("server-final-message is not UTF-8"))?;
                        if !s.verify_server(server_final) {
                            return refuse(client, "the server's SCRAM signature does not match: not the server the connector names").await;
                        }
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
    Err(protocol(why.to_string()))
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

/// The client side of SCRAM-SHA-256 (RFC 5802/7677), without channel binding.
struct Scram {
    nonce: String,
    auth_message: String,
    server_signature: [u8; 32],
}

impl Scram {
    fn new() -> Scram {
        let bytes: [u8; 18] = rand::random();
        Scram::with_nonce(base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    fn with_nonce(nonce: String) -> Scram {
        Scram { nonce, auth_message: String::new(), server_signature: [0; 32] }
    }

    fn client_first(&self) -> String {
        format!("n,,n=,r={}", self.nonce)
    }

    fn client_final(&mut self, server_first: &str, password: &str) -> Result<String, String> {
        let attr = |k: &str| server_first.split(',').find_map(|p| p.strip_prefix(k)).ok_or(format!("server-first-message lacks {k}"));
        let nonce = attr("r=")?;
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err("the server's nonce does not extend ours".into());
        }
        let salt = base64::engine::general_purpose::STANDARD.decode(attr("s=")?).map_err(|_| "salt is not base64".to_string())?;
        let iterations: u32 = attr("i=")?.parse().map_err(|_| "iteration count is not a number".to_string())?;
        if iterations == 0 || iterations > MAX_ITERATIONS {
            return Err(format!("iteration count {iterations} is out of range"));
        }
        let mut salted = [0u8; 32];
        pbkdf2::pbkdf2_hmac::<Sha256>(password.as_bytes(), &salt, iterations, &mut salted);
        let client_key = hmac(&salted, b"Client Key");
        let stored_key: [u8; 32] = Sha256::digest(client_key).into();
        let without_proof = format!("c=biws,r={nonce}");
        self.auth_message = format!("n=,r={},{server_first},{without_proof}", self.nonce);
        let signature = hmac(&stored_key, self.auth_message.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(signature.iter()).map(|(a, b)| a ^ b).collect();
        self.server_signature = hmac(&hmac(&salted, b"Server Key"), self.auth_message.as_bytes());
        Ok(format!("{without_proof},p={}", base64::engine::general_purpose::STANDARD.encode(proof)))
    }

    fn verify_server(&self, server_final: &str) -> bool {
        let Some(v) = server_final.split(',').find_map(|p| p.strip_prefix("v=")) else { return false };
        base64::engine::general_purpose::STANDARD.decode(v).is_ok_and(|sig| sig.len() == 32 && sig.iter().zip(self.server_signature.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scram_matches_the_rfc_7677_example() {
        // RFC 7677 §3 (user "user", password "pencil"); PostgreSQL sends an
        // empty n=, so the auth message differs only in that attribute.
        let mut s = Scram::with_nonce("rOprNGfwEbeRWgbNEkqO".into());
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let fin = s.client_final(server_first, "pencil").unwrap();
        assert!(fin.starts_with("c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p="), "{fin}");
        // Recompute the RFC's own auth message (n=user) to check the maths.
        let mut rfc = Scram::with_nonce("rOprNGfwEbeRWgbNEkqO".into());
        let _ = rfc.client_final(server_first, "pencil");
        rfc.auth_message = rfc.auth_message.replacen("n=,", "n=user,", 1);
        let salt = base64::engine::general_purpose::STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let mut salted = [0u8; 32];
        pbkdf2::pbkdf2_hmac::<Sha256>(b"pencil", &salt, 4096, &mut salted);
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
    fn scram_refuses_a_nonce_it_did_not_start_and_absurd_iterations() {
        let mut s = Scram::with_nonce("abc".into());
        assert!(s.client_final("r=xyz123,s=AAAA,i=4096", "p").is_err());
        assert!(s.client_final("r=abc,s=AAAA,i=4096", "p").is_err(), "the server must add to the nonce");
        assert!(s.client_final("r=abcdef,s=AAAA,i=99999999", "p").is_err());
    }

    #[test]
    fn md5_matches_postgres() {
        // 'md5' || md5(md5('secret' || 'alice') || salt), computed independently.
        assert_eq!(md5_password("alice", "secret", [1, 2, 3, 4]), "md598a0412b9c31436fc53776e863350083");
    }

    #[test]
    fn the_upstream_startup_carries_the_connectors_role() {
        let login = PgLogin { user: "agent".into(), password: "x".into(), database: Some("app".into()) };
        let params = vec![("user".to_string(), "sandbox".to_string()), ("application_name".to_string(), "psql".to_string())];
        let packet = startup(&params, &login);
        let body = &packet[8..];
        assert_eq!(parse_params(body).unwrap(), [("user".into(), "agent".into()), ("database".into(), "app".into()), ("application_name".into(), "psql".into())]);
        assert!(parse_params(b"user").is_err(), "a name without a value");
    }

    #[tokio::test]
    async fn a_client_is_told_only_that_authentication_succeeded() {
        let (mut client, mut client_side) = tokio::io::duplex(4096);
        let (mut server_side, mut server) = tokio::io::duplex(4096);
        let login = PgLogin { user: "agent".into(), password: "hunter2".into(), database: None };
        let fake_server = async {
            let startup = read_startup(&mut server).await.unwrap();
            assert!(parse_params(&startup[4..]).unwrap().contains(&("user".into(), "agent".into())));
            server.write_all(&message(b'R', &[0, 0, 0, 3])).await.unwrap();
            let (kind, body) = read_message(&mut server).await.unwrap();
            assert_eq!((kind, body.as_slice()), (b'p', &b"hunter2\0"[..]));
            server.write_all(&message(b'R', &[0, 0, 0, 0])).await.unwrap();
        };
        let fake_client = async {
            client.write_all(&framed_startup(&SSL_REQUEST.to_be_bytes())).await.unwrap();
            let mut n = [0u8; 1];
            client.read_exact(&mut n).await.unwrap();
            assert_eq!(&n, b"N");
            let mut body = PROTOCOL_3.to_be_bytes().to_vec();
            body.extend_from_slice(b"user\0sandbox\0\0");
            client.write_all(&framed_startup(&body)).await.unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 64];
            let n = client.read(&mut buf).await.unwrap();
            got.extend_from_slice(&buf[..n]);
            assert_eq!(got, message(b'R', &[0, 0, 0, 0]), "no challenge, no password: just ok");
        };
        let proxy = pg_login(&mut client_side, &mut server_side, &login);
        let (r, (), ()) = tokio::join!(proxy, fake_server, fake_client);
        assert_eq!(r.unwrap(), Handshake::Session);
    }
}
