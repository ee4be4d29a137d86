//! The exit's edge: [`Exit`] ⇄ `Exited`, in one place for both sides of
//! the wire. Sending bounds what it sends; reading bounds what it keeps and
//! never turns a failure it does not know into a success.

use std::time::Duration;

use warren_core::exit::{Blocked, Exit, Failure, MAX_BLOCKED, MAX_UNSYNCED_PATHS};

use crate::agent as pb;

impl From<&Exit> for pb::Exited {
    fn from(x: &Exit) -> pb::Exited {
        let (failure, failure_detail) = match &x.failure {
            None => (pb::Failure::Unspecified, String::new()),
            Some(Failure::Start(step)) => (pb::Failure::Start, step.clone()),
            Some(Failure::Sandbox(what)) => (pb::Failure::Sandbox, what.clone()),
            Some(Failure::ThreadMount) => (pb::Failure::ThreadMount, String::new()),
            Some(Failure::ThreadTooLarge) => (pb::Failure::ThreadTooLarge, String::new()),
            Some(Failure::ThreadSave) => (pb::Failure::ThreadSave, String::new()),
            Some(Failure::ThreadConflict) => (pb::Failure::ThreadConflict, String::new()),
            Some(Failure::ThreadLimit) => (pb::Failure::ThreadLimit, String::new()),
            Some(Failure::StorageMount(why)) => (pb::Failure::StorageMount, why.clone()),
            Some(Failure::StorageSync(_)) => (pb::Failure::StorageSync, String::new()),
            Some(Failure::CredentialMount(step)) => (pb::Failure::CredentialMount, step.clone()),
        };
        pb::Exited {
            exit_code: x.exit_code,
            signal: x.signal,
            timed_out: x.timed_out,
            oom_killed: x.oom_killed,
            cancelled: x.cancelled,
            wall_micros: x.wall.as_micros().try_into().unwrap_or(u64::MAX),
            cpu_micros: x.cpu_micros,
            peak_memory_bytes: x.peak_memory_bytes,
            stdout_truncated: x.stdout_truncated,
            stderr_truncated: x.stderr_truncated,
            failure: failure as i32,
            failure_detail,
            unsynced_paths: x.unsynced_paths().iter().take(MAX_UNSYNCED_PATHS).cloned().collect(),
            blocked_egress: x.blocked.iter().take(MAX_BLOCKED).map(blocked_to_wire).collect(),
        }
    }
}

impl From<pb::Exited> for Exit {
    fn from(x: pb::Exited) -> Exit {
        let detail = x.failure_detail;
        let failure = match pb::Failure::try_from(x.failure) {
            Ok(pb::Failure::Unspecified) => None,
            Ok(pb::Failure::Start) => Some(Failure::Start(detail)),
            Ok(pb::Failure::Sandbox) => Some(Failure::Sandbox(detail)),
            Ok(pb::Failure::ThreadMount) => Some(Failure::ThreadMount),
            Ok(pb::Failure::ThreadTooLarge) => Some(Failure::ThreadTooLarge),
            Ok(pb::Failure::ThreadSave) => Some(Failure::ThreadSave),
            Ok(pb::Failure::ThreadConflict) => Some(Failure::ThreadConflict),
            Ok(pb::Failure::ThreadLimit) => Some(Failure::ThreadLimit),
            Ok(pb::Failure::StorageMount) => Some(Failure::StorageMount(detail)),
            Ok(pb::Failure::StorageSync) => Some(Failure::StorageSync(x.unsynced_paths.into_iter().take(MAX_UNSYNCED_PATHS).collect())),
            Ok(pb::Failure::CredentialMount) => Some(Failure::CredentialMount(detail)),
            // A newer agent's failure is still a failure.
            Err(_) => Some(Failure::Sandbox(format!("failure {} this gateway does not know", x.failure))),
        };
        Exit {
            exit_code: x.exit_code,
            signal: x.signal,
            timed_out: x.timed_out,
            oom_killed: x.oom_killed,
            cancelled: x.cancelled,
            wall: Duration::from_micros(x.wall_micros),
            cpu_micros: x.cpu_micros,
            peak_memory_bytes: x.peak_memory_bytes,
            stdout_truncated: x.stdout_truncated,
            stderr_truncated: x.stderr_truncated,
            failure,
            blocked: x.blocked_egress.into_iter().take(MAX_BLOCKED).map(blocked_from_wire).collect(),
        }
    }
}

fn blocked_to_wire(b: &Blocked) -> pb::BlockedEgress {
    pb::BlockedEgress {
        host: b.host.clone().unwrap_or_default(),
        ip: b.ip.map(|ip| ip.to_string()).unwrap_or_default(),
        port: b.port.into(),
        protocol: b.protocol.clone(),
        count: b.count,
    }
}

/// An address that does not parse, or a port out of range, reads as absent.
fn blocked_from_wire(b: pb::BlockedEgress) -> Blocked {
    Blocked {
        host: (!b.host.is_empty()).then_some(b.host),
        ip: b.ip.parse().ok(),
        port: u16::try_from(b.port).unwrap_or(0),
        protocol: b.protocol,
        count: b.count,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testgen::Gen;

    impl Gen {
        fn failure(&mut self) -> Option<Failure> {
            Some(match self.below(11) {
                0 => return None,
                1 => Failure::Start(self.text()),
                2 => Failure::Sandbox(self.text()),
                3 => Failure::ThreadMount,
                4 => Failure::ThreadTooLarge,
                5 => Failure::ThreadSave,
                6 => Failure::ThreadConflict,
                7 => Failure::ThreadLimit,
                8 => Failure::StorageMount(self.text()),
                9 => Failure::StorageSync((0..self.below(MAX_UNSYNCED_PATHS as u64 + 1)).map(|i| format!("/data/m/{i}")).collect()),
                _ => Failure::CredentialMount(self.text()),
            })
        }
        fn blocked(&mut self) -> Blocked {
            let ip: Option<std::net::IpAddr> = match self.below(3) {
                0 => None,
                1 => Some(std::net::Ipv4Addr::from(self.next() as u32).into()),
                _ => Some(std::net::Ipv6Addr::from(u128::from(self.next()) << 64 | u128::from(self.next())).into()),
            };
            Blocked {
                host: self.flag().then(|| format!("{}.example", self.text())),
                ip,
                port: self.below(65536) as u16,
                protocol: ["tcp", "udp", "dns"][self.below(3) as usize].into(),
                count: self.next(),
            }
        }
        fn exit(&mut self) -> Exit {
            Exit {
                exit_code: self.next() as i32,
                signal: self.below(65) as i32,
                timed_out: self.flag(),
                oom_killed: self.flag(),
                cancelled: self.flag(),
                wall: Duration::from_micros(self.next() >> 8),
                cpu_micros: self.next(),
                peak_memory_bytes: self.flag().then(|| self.next()),
                stdout_truncated: self.flag(),
                stderr_truncated: self.flag(),
                failure: self.failure(),
                blocked: (0..self.below(MAX_BLOCKED as u64 + 1)).map(|_| self.blocked()).collect(),
            }
        }
    }

    #[test]
    fn every_exit_survives_the_wire() {
        let mut g = Gen(0x9E37_79B9_7F4A_7C15);
        for _ in 0..5000 {
            let exit = g.exit();
            let wire = pb::Exited::from(&exit);
            let encoded = prost::Message::encode_to_vec(&wire);
            let decoded: pb::Exited = prost::Message::decode(encoded.as_slice()).unwrap();
            assert_eq!(Exit::from(decoded), exit);
        }
    }

    #[test]
    fn reading_bounds_what_it_keeps_and_keeps_unknown_failures_failed() {
        let wire = pb::Exited {
            failure: 99,
            blocked_egress: (0..1000).map(|i| pb::BlockedEgress { ip: "not an address".into(), port: 70000 + i, ..Default::default() }).collect(),
            ..Default::default()
        };
        let exit = Exit::from(wire);
        assert!(matches!(exit.failure, Some(Failure::Sandbox(_))), "{:?}", exit.failure);
        assert_eq!(exit.blocked.len(), MAX_BLOCKED);
        assert!(exit.blocked.iter().all(|b| b.ip.is_none() && b.port == 0));
        let sync = pb::Exited { failure: pb::Failure::StorageSync as i32, unsynced_paths: vec!["/data/x".into(); 500], ..Default::default() };
        assert_eq!(Exit::from(sync).unsynced_paths().len(), MAX_UNSYNCED_PATHS);
    }

    #[test]
    fn each_failure_has_its_own_wire_value_and_keeps_its_step() {
        let cases = [
            (Failure::Start("exec".into()), pb::Failure::Start, "exec"),
            (Failure::Sandbox("supervisor lost".into()), pb::Failure::Sandbox, "supervisor lost"),
            (Failure::ThreadMount, pb::Failure::ThreadMount, ""),
            (Failure::ThreadTooLarge, pb::Failure::ThreadTooLarge, ""),
            (Failure::ThreadSave, pb::Failure::ThreadSave, ""),
            (Failure::ThreadConflict, pb::Failure::ThreadConflict, ""),
            (Failure::ThreadLimit, pb::Failure::ThreadLimit, ""),
            (Failure::StorageMount("bucket unreachable".into()), pb::Failure::StorageMount, "bucket unreachable"),
            (Failure::StorageSync(vec!["/data/a".into()]), pb::Failure::StorageSync, ""),
            (Failure::CredentialMount("forwarder".into()), pb::Failure::CredentialMount, "forwarder"),
        ];
        for (f, wire, detail) in cases {
            let x = pb::Exited::from(&Exit::never_ran(f));
            assert_eq!((x.failure(), x.failure_detail.as_str(), x.exit_code), (wire, detail, -1));
        }
        assert_eq!(pb::Exited::from(&Exit::default()).failure(), pb::Failure::Unspecified);
    }

    #[test]
    fn sending_bounds_what_it_sends() {
        let many = Exit { failure: Some(Failure::StorageSync(vec!["/data/x".into(); 500])), blocked: vec![Gen(7).blocked(); 200], ..Exit::default() };
        let wire = pb::Exited::from(&many);
        assert_eq!((wire.unsynced_paths.len(), wire.blocked_egress.len()), (MAX_UNSYNCED_PATHS, MAX_BLOCKED));
    }
}
