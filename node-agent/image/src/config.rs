//! The parts of an image's config Warren reads, and what it takes from them.
//! The config is the image author's wish list: Warren honours the harmless
//! parts (environment for the program) and ignores the rest (user,
//! entrypoint, volumes, exposed ports) — the sandbox's shape is Warren's.

use serde::Deserialize;

/// Largest config blob accepted.
pub const MAX_CONFIG_BYTES: i64 = 1 << 20;
/// Most environment entries taken from an image.
const MAX_ENV: usize = 128;
/// Longest environment entry taken from an image.
const MAX_ENV_ENTRY: usize = 4096;

/// `application/vnd.oci.image.config.v1+json`, the fields Warren uses.
#[derive(Debug, Default, Deserialize)]
pub struct ImageConfig {
    /// CPU architecture the image is built for.
    #[serde(default)]
    pub architecture: String,
    /// Operating system.
    #[serde(default)]
    pub os: String,
    /// Runtime configuration.
    #[serde(default)]
    pub config: Option<RunConfig>,
    /// Layer digests (of the uncompressed tars), base first.
    pub rootfs: RootFs,
}

/// `config` of an image config.
#[derive(Debug, Default, Deserialize)]
pub struct RunConfig {
    /// `NAME=value` entries.
    #[serde(rename = "Env", default)]
    pub env: Option<Vec<String>>,
}

/// `rootfs` of an image config.
#[derive(Debug, Default, Deserialize)]
pub struct RootFs {
    /// `sha256:…` of each uncompressed layer.
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

/// Names the image may not set: the loader, interpreter start-up hooks
/// and Warren's own variables stay Warren's.
fn reserved(name: &str) -> bool {
    name.starts_with("LD_")
        || name.starts_with("WARREN_")
        || matches!(name, "HOME" | "USER" | "LOGNAME" | "SHELL" | "PYTHONSTARTUP" | "PYTHONINSPECT" | "NODE_OPTIONS" | "BASH_ENV" | "ENV" | "PROMPT_COMMAND")
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl ImageConfig {
    /// The image's environment as Warren passes it on: well-formed,
    /// non-reserved entries without control characters, bounded in count
    /// and size; `PATH` only if every entry is absolute.
    pub fn env(&self) -> Vec<(String, String)> {
        let entries = self.config.as_ref().and_then(|c| c.env.as_ref()).map(Vec::as_slice).unwrap_or_default();
        let mut out: Vec<(String, String)> = Vec::new();
        for entry in entries.iter().filter(|e| e.len() <= MAX_ENV_ENTRY) {
            let Some((name, value)) = entry.split_once('=') else { continue };
            if !valid_name(name) || reserved(name) || value.chars().any(char::is_control) {
                continue;
            }
            if name == "PATH" && !value.split(':').all(|p| p.starts_with('/')) {
                continue;
            }
            out.retain(|(n, _)| n != name);
            out.push((name.to_string(), value.to_string()));
            if out.len() == MAX_ENV {
                break;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_env_is_filtered() {
        let config: ImageConfig = serde_json::from_str(
            r#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":["sha256:00"]},
                "config":{"User":"0","Entrypoint":["/evil"],"Env":["PATH=/opt/py/bin:/usr/bin","LANG=C.UTF-8","LD_PRELOAD=/x.so",
                "WARREN_TOKEN=x","HOME=/root","bad name=1","NOEQ","CTRL=a\u0007b","PYTHONUNBUFFERED=1","LANG=en_US.UTF-8"]}}"#,
        )
        .unwrap();
        assert_eq!(
            config.env(),
            [("PATH".into(), "/opt/py/bin:/usr/bin".into()), ("PYTHONUNBUFFERED".into(), "1".into()), ("LANG".into(), "en_US.UTF-8".into())]
        );
        let relative: ImageConfig = serde_json::from_str(r#"{"rootfs":{"diff_ids":[]},"config":{"Env":["PATH=.:/bin"]}}"#).unwrap();
        assert!(relative.env().is_empty(), "a relative PATH entry would run files from the working directory");
    }
}
