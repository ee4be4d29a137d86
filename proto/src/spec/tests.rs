use std::collections::BTreeMap;

use warren_core::kinds::{ConnectorKind, Provider};

use super::*;
use crate::testgen::Gen;

impl Gen {
    fn pick<T: Copy>(&mut self, all: &[T]) -> T {
        all[self.below(all.len() as u64) as usize]
    }
    fn nonzero(&mut self, max: u64) -> u64 {
        self.below(max) + 1
    }
    fn map(&mut self) -> BTreeMap<String, String> {
        (0..self.below(4)).map(|_| (self.word().to_uppercase(), self.text())).collect()
    }
    fn limits(&mut self) -> LimitRequest {
        let n32 = |g: &mut Gen| g.flag().then(|| g.nonzero(u64::from(u32::MAX)) as u32);
        LimitRequest {
            cpu_millis: n32(self),
            memory_bytes: self.flag().then(|| self.nonzero(u64::MAX - 1)),
            pids: n32(self),
            tmp_bytes: self.flag().then(|| self.nonzero(1 << 40)),
            home_bytes: self.flag().then(|| self.nonzero(1 << 40)),
            max_output_bytes: self.flag().then(|| self.nonzero(1 << 40)),
            open_files: n32(self),
            file_size_bytes: self.flag().then(|| self.nonzero(1 << 40)),
        }
    }
    fn mount(&mut self) -> Mount {
        Mount {
            name: self.word(),
            provider: self.pick(&Provider::ALL),
            bucket: self.text(),
            prefix: self.text(),
            read_only: self.flag(),
            endpoint: self.maybe(),
            region: self.maybe(),
            credentials: Credentials(self.map()),
            max_write_bytes: self.next(),
            ambient_identity: self.flag(),
        }
    }
    fn connector(&mut self) -> Connector {
        Connector {
            name: self.word(),
            kind: self.pick(&ConnectorKind::ALL),
            host: self.maybe(),
            port: self.flag().then(|| self.nonzero(65535) as u16),
            database: self.maybe(),
            username: self.maybe(),
            project: self.maybe(),
            endpoint: self.maybe(),
            region: self.maybe(),
            custody: self.flag(),
            tls_disabled: self.flag(),
            tls_ca_pem: self.maybe(),
            tls_server_name: self.maybe(),
            weak_auth: (0..self.below(3)).map(|_| self.word()).collect(),
            credentials: Credentials(self.map()),
        }
    }
    fn thread(&mut self) -> Thread {
        Thread {
            namespace: self.word(),
            key_name: self.word(),
            id: self.word(),
            retention: self.flag().then(|| Duration::from_secs(self.nonzero(1 << 40))),
            max_bytes: self.nonzero(u64::MAX - 1),
            max_threads: self.flag().then(|| self.nonzero(u64::from(u32::MAX)) as u32),
            history: self.nonzero(1000) as u32,
        }
    }
    fn spec(&mut self) -> Spec {
        let pull = Some(Credentials([("username".to_string(), self.word()), ("password".to_string(), self.word())].into()));
        Spec {
            id: if self.flag() { self.word() } else { String::new() },
            language: self.pick(&Language::ALL),
            code: self.text(),
            env: self.map(),
            timeout: Duration::from_millis(self.below(u64::from(u32::MAX) + 1)),
            limits: self.limits(),
            image: Image { reference: self.pick(&["host", "", "registry.local/py:3"]).into(), digest: self.maybe(), pull: pull.filter(|_| self.flag()) },
            network: self.pick(&[Network::Blocked, Network::Unrestricted]),
            egress: (0..self.below(3)).map(|_| EgressRule { host: self.word(), ports: (0..self.below(3)).map(|_| self.below(65536) as u16).collect() }).collect(),
            mounts: (0..self.below(3)).map(|_| self.mount()).collect(),
            connectors: (0..self.below(3)).map(|_| self.connector()).collect(),
            thread: self.flag().then(|| self.thread()),
            warm_modules: (0..self.below(3)).map(|_| self.word()).collect(),
            trace: self.flag().then(|| warren_core::trace::Trace {
                parent: warren_core::trace::SpanRef { trace_id: [self.nonzero(255) as u8; 16], span_id: [self.nonzero(255) as u8; 8], sampled: self.flag() },
                state: self.flag().then(|| format!("k{}=v", self.nonzero(100))),
            }),
        }
    }
}

fn through_the_wire(req: pb::ExecuteRequest) -> pb::ExecuteRequest {
    prost::Message::decode(prost::Message::encode_to_vec(&req).as_slice()).unwrap()
}

#[test]
fn every_spec_survives_the_wire() {
    let mut g = Gen(0xD1B5_4A32_D192_ED03);
    for _ in 0..3000 {
        let spec = g.spec();
        let wire = through_the_wire(pb::ExecuteRequest::from(&spec));
        assert_eq!(Spec::try_from(wire).as_ref(), Ok(&spec));
    }
}

fn base() -> pb::ExecuteRequest {
    pb::ExecuteRequest { language: pb::Language::Python as i32, code: "x".into(), timeout_ms: 1500, ..Default::default() }
}

#[test]
fn zero_on_the_wire_means_the_node_default() {
    let s = Spec::try_from(base()).unwrap();
    assert_eq!((s.limits, s.timeout, s.network, s.image.digest, s.thread), (LimitRequest::default(), Duration::from_millis(1500), Network::Blocked, None, None));
}

#[test]
fn values_from_a_newer_sender_are_refused_as_unsupported() {
    let mount = |provider: &str, kind: i32| pb::StorageMount { mount_path: "/data/m".into(), provider: provider.into(), provider_kind: kind, ..Default::default() };
    for (req, field) in [
        (pb::ExecuteRequest { network: 99, ..base() }, "network"),
        (pb::ExecuteRequest { mounts: vec![mount("ftp", 0)], ..base() }, "mounts[0].provider"),
        (pb::ExecuteRequest { mounts: vec![mount("s3", 0), mount("s3", 77)], ..base() }, "mounts[1].provider"),
    ] {
        match Spec::try_from(req) {
            Err(WireError::Unsupported(e)) => assert_eq!(e.field, field),
            other => panic!("{field}: {other:?}"),
        }
    }
}

#[test]
fn malformed_requests_are_invalid_and_name_their_field() {
    let grant = |kind: &str, port: u32| pb::ConnectorGrant { name: "c".into(), kind: kind.into(), port, ..Default::default() };
    let thread = |r: Option<pb::ThreadRef>, max_bytes: u64| Some(pb::ThreadOptions { r#ref: r, max_bytes, ..Default::default() });
    for (req, field) in [
        (pb::ExecuteRequest { language: 0, ..base() }, "language"),
        (pb::ExecuteRequest { language: 42, ..base() }, "language"),
        (pb::ExecuteRequest { egress: vec![pb::EgressRule { host: "a.example".into(), ports: vec![70000] }], ..base() }, "egress"),
        (pb::ExecuteRequest { mounts: vec![pb::StorageMount { mount_path: "/etc".into(), provider: "s3".into(), ..Default::default() }], ..base() }, "mounts[0].mount_path"),
        (pb::ExecuteRequest { connectors: vec![grant("ftp", 0)], ..base() }, "connectors"),
        (pb::ExecuteRequest { connectors: vec![grant("redis", 70000)], ..base() }, "connectors"),
        (pb::ExecuteRequest { thread: thread(None, 1), ..base() }, "thread.ref"),
        (pb::ExecuteRequest { thread: thread(Some(pb::ThreadRef::default()), 0), ..base() }, "thread.max_bytes"),
    ] {
        match Spec::try_from(req) {
            Err(WireError::Invalid(e)) => assert_eq!(e.field, field),
            other => panic!("{field}: {other:?}"),
        }
    }
}

#[test]
fn names_from_an_older_sender_still_read() {
    let req = pb::ExecuteRequest {
        mounts: vec![pb::StorageMount { mount_path: "/data/m".into(), provider: "gcs".into(), mode: pb::MountMode::Unspecified as i32, ..Default::default() }],
        connectors: vec![pb::ConnectorGrant { name: "db".into(), kind: "postgresql".into(), ..Default::default() }],
        ..base()
    };
    let s = Spec::try_from(req).unwrap();
    assert_eq!((s.mounts[0].provider, s.mounts[0].read_only, s.connectors[0].kind), (Provider::Gcs, true, ConnectorKind::Postgres));
}
