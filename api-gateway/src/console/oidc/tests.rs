use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair, RsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING, RSA_PKCS1_SHA256};
use serde_json::{json, Value};

use super::*;

/// A throwaway 2048-bit RSA key (PKCS#1 DER, base64) made for these tests.
const TEST_RSA_KEY: &str = "
MIIEowIBAAKCAQEAqVAnBWrKzOHqU89ONA5ZVQ20JQnJ6We14VBIFaBWZ7hq0+doNQULv16aB8iPDuF8+SmLoMxUMog8b7VpJDEtZkGAIz5w87E5XSoAcaKstpS0bwc0T2caI6A6OGVoKLqe57i0m3sl5tRnV6FYNFrUtd7bp3phoafH4EG/q9dTgd9UBVM4cpilxvNUyiW2CebZUzQ2MmyFb0h+Gr6Nku23JZd/RiLcqij4+PFicJzDpMSrCjxpZzRU5ISqvQFxMjY6UWjhIjcMlbMkkeYYTiFoFO4LNQd8TyCtlNTAccmv7z+/JLbAmyXWYPMFxOxkBY2vgcXIdKMHwCbxibw3j0T7mwIDAQABAoIBAAO0Ep5uNxBjMqZxpuLBm5eeLJ4QyD9YOuS6RlFex/UN1hxbd+6M9TRS4+ierO5k5UBn9btnLMJMM5I39BxMDROrBBwBPiQ+cKRGimrx5Xg66XVyQWUpOquj0hIwuaYGavpjkmPCPlJ9u+LxTwYaJIPz43cW2LLaAie4GHKwS43QJRoEW7My94TWTOgmHH5gNdD8JUK9VsZi6YygHk/oTpzJ/3sSNrdpjEFemqTaj91x+1dF1aLS52qAJ/gY3yFkMAhHctBcCtOVIcalCj9/Va4pCAee4sXepAGiYcG3Q8utx3UjS+vluTFaP7qLq88k6Rk3B76KPINRqSB5tYrHHB0CgYEA4T496Q5+8YwcRz4+k+F6mZkfW6bZFh92oQ3wbmDOUSW4i4sz4uXSKJA+YtALTSD1/VKjgZIAIkm9uCv47ARy/sDTmc7iaJKHwKdvHPAYLjiC2fZv0XfjnBNEL4UCrj6d6rmjIr8AoS37IGYcdqCPluPDeaP4YH2H9QBD5y4EHF0CgYEAwG7H2vGwCGC7awtRuPlrO37MZOECsKIdDwv4uaqOYn/8MQ+54odONk5LPSgqeGOC0ZEroOgga9uXF6qwQldnuNjpu3B3Kda1o7XQvU2Ak95BjGJp4SyHHRChX1m1rpG5SgfT8N3nwkRNJ8A/Y71DV+cduk9gFcs06tU4BUmnOFcCgYAtkPPhU+dmYhvOZc8vB2xP6mQnnGdKTG8pQbKkAb17ORBOWojSm/+Z6SRVxRSkM8jPyIn/SlPwm85flbWzuWqyErw731h6IzqHRNf7mK6rmw8NnQcd7w0Co/slSdky+sPjmk5gVxd/g9fLxBx5+x1RPx5qWzuB+aMpczZJbEu0mQKBgAeCy24yTMqm6+nLsU7k/Vh/JH8zgSVfzn6N2xF0JMaXdEJ9+KVs3pKkD6+9Z5r3V13Sqr9HECzlj0ovMV4Fh1jhro3QX/ZUGRbgu9sHsWMUI77VAIj3cfaidYoBOGQt7+uBzrXyE1+zxscsa8z60CwYK0LgYkG3gsM/u0YJj+tVAoGBANwwsGz0TLB0OS8LDg/qgNjpn2o7oQVhhCYQavxnJfHVAlAT1E9jB0EL6mfhYR3QHfO6EzpDM18D3a3WkGnpdxOStDwoKGcnp4JzPv+T5qfwVjaMykOTLkjFx5rcH74ASA61T9UrNkfKdZ9jMtdJKL95qQDcES5Ws+P7w8otern/";

const ISSUER: &str = "https://idp.example.test";
const CLIENT: &str = "warren-console";
const NOW: i64 = 1_800_000_000;

static DEFAULT: std::sync::LazyLock<ClaimMapping> = std::sync::LazyLock::new(ClaimMapping::default);

fn want(nonce: &str) -> Expected<'_> {
    Expected { issuer: ISSUER, client_id: CLIENT, nonce, now: NOW, leeway: 60, mapping: &DEFAULT }
}

fn claims() -> Value {
    json!({"iss": ISSUER, "sub": "u-1", "aud": CLIENT, "exp": NOW + 300, "iat": NOW - 5, "nonce": "n-1", "email": "ada@example.test", "email_verified": true, "groups": ["platform"]})
}

fn b64json(v: &Value) -> String {
    B64.encode(serde_json::to_vec(v).unwrap())
}

/// A provider with one key of each type.
struct Provider {
    ec: EcdsaKeyPair,
    rsa: RsaKeyPair,
    rng: SystemRandom,
}

impl Provider {
    fn new() -> Provider {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let ec = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
        let rsa = RsaKeyPair::from_der(&base64::engine::general_purpose::STANDARD.decode(TEST_RSA_KEY.trim()).unwrap()).unwrap();
        Provider { ec, rsa, rng }
    }

    fn jwks(&self) -> Vec<u8> {
        let point = self.ec.public_key().as_ref();
        let rsa = RsaPublicKeyComponents::<Vec<u8>>::from(self.rsa.public());
        serde_json::to_vec(&json!({"keys": [
            {"kty": "EC", "crv": "P-256", "kid": "ec-1", "use": "sig", "x": B64.encode(&point[1..33]), "y": B64.encode(&point[33..])},
            {"kty": "RSA", "kid": "rsa-1", "n": B64.encode(&rsa.n), "e": B64.encode(&rsa.e)},
            {"kty": "oct", "kid": "hmac", "k": "c2VjcmV0"},
        ]}))
        .unwrap()
    }

    fn sign(&self, header: &Value, claims: &Value) -> String {
        let input = format!("{}.{}", b64json(header), b64json(claims));
        let sig = match header["alg"].as_str() {
            Some("RS256") => {
                let mut sig = vec![0; self.rsa.public().modulus_len()];
                self.rsa.sign(&RSA_PKCS1_SHA256, &self.rng, input.as_bytes(), &mut sig).unwrap();
                sig
            }
            _ => self.ec.sign(&self.rng, input.as_bytes()).unwrap().as_ref().to_vec(),
        };
        format!("{input}.{}", B64.encode(sig))
    }
}

fn es256() -> Value {
    json!({"alg": "ES256", "kid": "ec-1", "typ": "JWT"})
}

#[test]
fn pkce_is_s256_of_the_verifier() {
    let p = Pkce::from_random([7; 32]);
    assert_eq!(p.verifier.len(), 43);
    // RFC 7636 Appendix B's verifier and challenge.
    let rfc = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
    assert_eq!(B64.encode(Sha256::digest(rfc.as_bytes())), "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM");
    assert_eq!(p.challenge, B64.encode(Sha256::digest(p.verifier.as_bytes())));
    assert_ne!(Pkce::from_random([8; 32]).challenge, p.challenge);
}

#[test]
fn a_token_from_the_provider_signs_its_user_in_with_either_key_type() {
    let idp = Provider::new();
    let keys = Jwks::parse(&idp.jwks()).unwrap();
    for header in [es256(), json!({"alg": "RS256", "kid": "rsa-1"})] {
        let id = verify_id_token(&idp.sign(&header, &claims()), &keys, &want("n-1")).unwrap();
        assert_eq!((id.subject.as_str(), id.user.as_str(), id.groups.as_slice()), ("u-1", "ada@example.test", &["platform".to_string()][..]));
    }
}

#[test]
fn claims_that_do_not_match_the_sign_in_are_refused() {
    let idp = Provider::new();
    let keys = Jwks::parse(&idp.jwks()).unwrap();
    let with = |k: &str, v: Value| {
        let mut c = claims();
        c[k] = v;
        verify_id_token(&idp.sign(&es256(), &c), &keys, &want("n-1")).unwrap_err()
    };
    assert_eq!(with("iss", json!("https://idp.example.test/other")), TokenError::Claim("issuer"));
    assert_eq!(with("aud", json!("someone-else")), TokenError::Claim("audience"));
    assert_eq!(with("aud", json!([CLIENT, "someone-else"])), TokenError::Claim("authorized party"), "several audiences need azp");
    assert_eq!(with("nonce", json!("n-2")), TokenError::Claim("nonce"), "a token from another sign-in (replay)");
    assert_eq!(with("nonce", Value::Null), TokenError::Claim("nonce"));
    assert_eq!(with("exp", json!(NOW - 61)), TokenError::Time);
    assert_eq!(with("iat", json!(NOW + 61)), TokenError::Time);
    let mut several = claims();
    several["aud"] = json!([CLIENT, "someone-else"]);
    several["azp"] = json!(CLIENT);
    assert!(verify_id_token(&idp.sign(&es256(), &several), &keys, &want("n-1")).is_ok());
}

#[test]
fn forged_tokens_are_refused() {
    let idp = Provider::new();
    let keys = Jwks::parse(&idp.jwks()).unwrap();
    let good = idp.sign(&es256(), &claims());
    let w = want("n-1");
    // The payload changed after signing (a group added).
    let mut parts: Vec<String> = good.split('.').map(String::from).collect();
    let mut elevated = claims();
    elevated["groups"] = json!(["platform", "cluster-admins"]);
    parts[1] = b64json(&elevated);
    assert_eq!(verify_id_token(&parts.join("."), &keys, &w), Err(TokenError::Signature));
    // Another provider's key, under our key's id.
    let other = Provider::new();
    assert_eq!(verify_id_token(&other.sign(&es256(), &claims()), &keys, &w), Err(TokenError::Signature));
    // No signature at all, and the public RSA key used as an HMAC secret.
    let unsigned = format!("{}.{}.", b64json(&json!({"alg": "none"})), b64json(&claims()));
    assert_eq!(verify_id_token(&unsigned, &keys, &w), Err(TokenError::Algorithm("none".into())));
    let hs = format!("{}.{}.AAAA", b64json(&json!({"alg": "HS256", "kid": "rsa-1"})), b64json(&claims()));
    assert_eq!(verify_id_token(&hs, &keys, &w), Err(TokenError::Algorithm("HS256".into())));
    // An RS256 header on an EC key id, and a key id the provider does not have.
    assert_eq!(verify_id_token(&idp.sign(&json!({"alg": "RS256", "kid": "ec-1"}), &claims()), &keys, &w), Err(TokenError::UnknownKey));
    assert_eq!(verify_id_token(&idp.sign(&json!({"alg": "ES256", "kid": "gone"}), &claims()), &keys, &w), Err(TokenError::UnknownKey));
    for junk in ["", "a.b", "a.b.c.d", &"x".repeat(MAX_TOKEN_BYTES + 1), "!!.??.**"] {
        assert_eq!(verify_id_token(junk, &keys, &w), Err(TokenError::Malformed), "{junk:.20}");
    }
}

#[test]
fn without_a_key_id_only_a_single_key_of_the_type_is_used() {
    let idp = Provider::new();
    let keys = Jwks::parse(&idp.jwks()).unwrap();
    assert!(verify_id_token(&idp.sign(&json!({"alg": "ES256"}), &claims()), &keys, &want("n-1")).is_ok());
    let other = Provider::new();
    let mut two: Value = serde_json::from_slice(&idp.jwks()).unwrap();
    let more: Value = serde_json::from_slice(&other.jwks()).unwrap();
    two["keys"].as_array_mut().unwrap().push(more["keys"][0].clone());
    let keys = Jwks::parse(&serde_json::to_vec(&two).unwrap()).unwrap();
    assert_eq!(verify_id_token(&idp.sign(&json!({"alg": "ES256"}), &claims()), &keys, &want("n-1")), Err(TokenError::UnknownKey), "ambiguous: not guessed");
}

#[test]
fn what_a_token_carries_is_bounded() {
    let idp = Provider::new();
    let keys = Jwks::parse(&idp.jwks()).unwrap();
    let mut c = claims();
    c["groups"] = Value::from((0..1000).map(|i| format!("g{i}")).chain(["x".repeat(MAX_GROUP_BYTES + 1)]).collect::<Vec<_>>());
    let id = verify_id_token(&idp.sign(&es256(), &c), &keys, &want("n-1")).unwrap();
    assert_eq!((id.groups.len(), id.user.as_str()), (MAX_GROUPS, "ada@example.test"));
    c["email"] = json!(format!("{}@example.test", "a".repeat(300)));
    assert_eq!(verify_id_token(&idp.sign(&es256(), &c), &keys, &want("n-1")), Err(TokenError::Identity("the username is too long")));
}

/// The identity a token with `claims` gives under `mapping`.
fn mapped(mapping: &ClaimMapping, claims: &Value) -> Result<Identity, TokenError> {
    let idp = Provider::new();
    let keys = Jwks::parse(&idp.jwks()).unwrap();
    verify_id_token(&idp.sign(&es256(), claims), &keys, &Expected { mapping, ..want("n-1") })
}

#[test]
fn an_unverified_email_from_the_provider_is_not_a_username() {
    let mut c = claims();
    c["email"] = json!("admin@example.test");
    c["email_verified"] = json!(false);
    let refused = Err(TokenError::Identity("the provider does not say the email address is verified"));
    assert_eq!(mapped(&ClaimMapping::default(), &c), refused, "anyone may type someone else's address at an open provider");
    c.as_object_mut().unwrap().remove("email_verified");
    assert_eq!(mapped(&ClaimMapping::default(), &c), refused, "silence is not verification");
    c["email_verified"] = json!("true");
    assert_eq!(mapped(&ClaimMapping::default(), &c), refused, "only the JSON value true");
    c.as_object_mut().unwrap().remove("email");
    c["preferred_username"] = json!("admin@example.test");
    assert_eq!(mapped(&ClaimMapping::default(), &c), Err(TokenError::Identity("the token carries no username claim")), "no fallback to another claim");
}

#[test]
fn system_names_from_the_provider_never_reach_rbac() {
    let mut c = claims();
    c["groups"] = json!(["system:masters", "platform", "system:nodes"]);
    let id = mapped(&ClaimMapping::default(), &c).unwrap();
    assert_eq!(id.groups, ["platform"], "reserved groups are dropped");
    c["preferred_username"] = json!("system:admin");
    let by_name = ClaimMapping { username_claim: "preferred_username".into(), username_prefix: Some("-".into()), ..ClaimMapping::default() };
    assert_eq!(mapped(&by_name, &c), Err(TokenError::Identity("the username is a Kubernetes system name (system:…)")));
    c["email"] = json!("system:serviceaccount:kube-system:default");
    assert!(matches!(mapped(&ClaimMapping::default(), &c), Err(TokenError::Identity(_))));
    let prefixed = ClaimMapping { groups_prefix: "oidc:".into(), ..ClaimMapping::default() };
    c["email"] = json!("ada@example.test");
    assert_eq!(mapped(&prefixed, &c).unwrap().groups, ["oidc:system:masters", "oidc:platform", "oidc:system:nodes"], "a prefix keeps them out of system:");
    for bad in [ClaimMapping { username_prefix: Some("system:".into()), ..ClaimMapping::default() }, ClaimMapping { groups_prefix: "system:x-".into(), ..ClaimMapping::default() }] {
        assert!(bad.check().is_err(), "{bad:?}");
    }
    assert!(ClaimMapping::default().check().is_ok());
}

#[test]
fn usernames_and_groups_follow_the_api_servers_oidc_flags() {
    let mut c = claims();
    c["preferred_username"] = json!("ada");
    c["roles"] = json!("admins");
    // --oidc-username-claim=sub without a prefix: the issuer's URL and '#' (the API server's default).
    let sub = ClaimMapping { username_claim: "sub".into(), ..ClaimMapping::default() };
    assert_eq!(mapped(&sub, &c).unwrap().user, format!("{ISSUER}#u-1"));
    let named = ClaimMapping { username_claim: "preferred_username".into(), username_prefix: Some("oidc:".into()), groups_claim: "roles".into(), groups_prefix: "oidc:".into() };
    let id = mapped(&named, &c).unwrap();
    assert_eq!((id.user.as_str(), id.groups.as_slice()), ("oidc:ada", &["oidc:admins".to_string()][..]), "a groups claim may be one string");
    let bare = ClaimMapping { username_claim: "preferred_username".into(), username_prefix: Some("-".into()), ..ClaimMapping::default() };
    assert_eq!(mapped(&bare, &c).unwrap().user, "ada", "'-' turns the prefix off");
    let email = ClaimMapping { username_prefix: Some("corp:".into()), ..ClaimMapping::default() };
    assert_eq!(mapped(&email, &c).unwrap().user, "corp:ada@example.test");
    c["groups"] = json!([1, {"x": 2}, "", "ok"]);
    assert_eq!(mapped(&ClaimMapping::default(), &c).unwrap().groups, ["ok"], "entries that are not names are skipped");
}

#[test]
fn a_jwks_without_a_usable_key_is_refused() {
    for doc in [&br#"{"keys": []}"#[..], br#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#, br#"{"keys": [{"kty": "RSA", "n": "AQAB", "e": "AQAB"}]}"#, br#"{"keys": [{"kty": "EC", "crv": "P-256", "x": "AA", "y": "AA", "use": "sig"}]}"#, b"not json"] {
        assert!(Jwks::parse(doc).is_err(), "{}", String::from_utf8_lossy(doc));
    }
    let enc_only = br#"{"keys": [{"kty": "EC", "crv": "P-256", "use": "enc", "x": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "y": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}]}"#;
    assert!(Jwks::parse(enc_only).is_err(), "encryption keys do not sign");
}
