//! What a SCRAM login may cost the agent. The server names the PBKDF2
//! iteration count, and whatever answers at a connector's address is
//! hostile: a server asking for a million iterations per login, with a
//! sandbox opening connection after connection, made the agent burn a core
//! on its async runtime and slowed every other tenant's calls. So:
//!
//! - the count has a ceiling ([`MAX_ITERATIONS`], 24× PostgreSQL's default);
//! - each sandbox's logins draw from its own bucket of iterations
//!   ([`ITERATIONS_PER_SECOND`], a burst of one ceiling-sized login): a
//!   sandbox that logs in faster waits (inside the login's time limit), and
//!   no sandbox's rate is another's;
//! - the hashing runs on the blocking pool, at most [`HASHERS`] at once for
//!   the whole agent, never on the runtime threads serving other calls.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::Sha256;
use tokio::sync::Semaphore;

/// Most PBKDF2 iterations a server may ask for (PostgreSQL's default,
/// `scram_iterations`, is 4096). A server asking for more gets no login.
pub const MAX_ITERATIONS: u32 = 100_000;
/// Iterations per second one sandbox's logins may cost, on average:
/// about 24 logins a second at PostgreSQL's default.
pub const ITERATIONS_PER_SECOND: u32 = 100_000;
/// Hashes computed at once, for every sandbox of the agent together.
pub const HASHERS: usize = 1;

static POOL: Semaphore = Semaphore::const_new(HASHERS);

/// One sandbox's bucket of PBKDF2 iterations (shared by its connectors).
#[derive(Debug)]
pub struct HashBudget {
    /// Iterations available now, and when that was computed.
    state: Mutex<(f64, Instant)>,
    rate: f64,
    burst: f64,
}

impl Default for HashBudget {
    fn default() -> HashBudget {
        HashBudget::new(ITERATIONS_PER_SECOND, MAX_ITERATIONS)
    }
}

impl HashBudget {
    /// A full bucket of `burst` iterations, refilled at `rate` a second.
    pub fn new(rate: u32, burst: u32) -> HashBudget {
        HashBudget { state: Mutex::new((f64::from(burst), Instant::now())), rate: f64::from(rate.max(1)), burst: f64::from(burst) }
    }

    /// Takes `n` iterations now, or says how long until they are there.
    fn try_take(&self, n: u32, now: Instant) -> Result<(), Duration> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (tokens, at) = *state;
        let tokens = (tokens + now.saturating_duration_since(at).as_secs_f64() * self.rate).min(self.burst);
        let n = f64::from(n).min(self.burst);
        if tokens >= n {
            *state = (tokens - n, now);
            return Ok(());
        }
        *state = (tokens, now);
        Err(Duration::from_secs_f64((n - tokens) / self.rate))
    }

    /// Waits until `n` iterations are in the bucket, and takes them.
    async fn take(&self, n: u32) {
        while let Err(wait) = self.try_take(n, Instant::now()) {
            tokio::time::sleep(wait).await;
        }
    }
}

/// SCRAM's SaltedPassword, `PBKDF2-HMAC-SHA256(password, salt, iterations)`,
/// paid for from `budget` and computed off the async runtime.
pub async fn salted_password(password: &str, salt: &[u8], iterations: u32, budget: &HashBudget) -> Result<[u8; 32], String> {
    if iterations == 0 || iterations > MAX_ITERATIONS {
        return Err(format!("the server asks for {iterations} PBKDF2 iterations; custody computes at most {MAX_ITERATIONS}"));
    }
    budget.take(iterations).await;
    let _hasher = POOL.acquire().await.map_err(|e| e.to_string())?;
    let (password, salt) = (password.as_bytes().to_vec(), salt.to_vec());
    tokio::task::spawn_blocking(move || {
        let mut salted = [0u8; 32];
        pbkdf2::pbkdf2_hmac::<Sha256>(&password, &salt, iterations, &mut salted);
        salted
    })
    .await
    .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_logs_in_at_its_own_rate() {
        let b = HashBudget::new(1000, 4000);
        let t0 = Instant::now();
        assert_eq!(b.try_take(4000, t0), Ok(()), "a full burst");
        let wait = b.try_take(500, t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-6, "{wait:?}");
        assert_eq!(b.try_take(500, t0 + Duration::from_millis(500)), Ok(()), "refilled at its rate");
        assert!(b.try_take(4000, t0 + Duration::from_secs(100)).is_ok(), "never more than the burst");
        assert!(b.try_take(1, t0 + Duration::from_secs(100)).is_err());
        let other = HashBudget::new(1000, 4000);
        assert_eq!(other.try_take(4000, t0), Ok(()), "one sandbox's spending is not another's");
    }

    #[tokio::test]
    async fn the_iteration_count_has_a_ceiling() {
        let b = HashBudget::default();
        assert!(salted_password("p", b"s", 1_000_000, &b).await.unwrap_err().contains("at most 100000"));
        assert!(salted_password("p", b"s", 0, &b).await.is_err());
        let rfc = salted_password("pencil", &base64::Engine::decode(&base64::engine::general_purpose::STANDARD, "W22ZaJ0SNY7soEsUEjb6gQ==").unwrap(), 4096, &b).await.unwrap();
        let mut expected = [0u8; 32];
        pbkdf2::pbkdf2_hmac::<Sha256>(b"pencil", &base64::Engine::decode(&base64::engine::general_purpose::STANDARD, "W22ZaJ0SNY7soEsUEjb6gQ==").unwrap(), 4096, &mut expected);
        assert_eq!(rfc, expected);
    }
}
