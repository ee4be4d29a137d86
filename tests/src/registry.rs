//! A real OCI registry for the image tests: Debian's `docker-registry`
//! (distribution 2.8) on a loopback port, plus a small image builder that
//! pushes through the same client library the node-agent pulls with.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::{Digest, Sha256};

/// A running registry; killed on drop, its storage removed with its tempdir.
pub struct Registry {
    child: Child,
    /// Where it serves (plain HTTP, loopback).
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Registry {
    /// Starts `docker-registry` on loopback and waits until it answers.
    pub fn start() -> anyhow::Result<Registry> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        Registry::start_at(format!("127.0.0.1:{port}").parse()?)
    }

    /// Starts it on `addr`, a local address (loopback, or the gateway of a
    /// bridge this machine made, for pods to reach).
    pub fn start_at(addr: SocketAddr) -> anyhow::Result<Registry> {
        let binary = std::path::Path::new("/usr/bin/docker-registry");
        if !binary.exists() {
            bail!("docker-registry is not installed: scripts/test.sh installs it (apt-get install docker-registry)");
        }
        let dir = tempfile::Builder::new().prefix("warren-registry-").tempdir()?;
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
                dir.path().join("data").display()
            ),
        )?;
        let child = Command::new(binary)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting docker-registry")?;
        let registry = Registry { child, addr, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(addr).is_err() {
            if Instant::now() > deadline {
                bail!("docker-registry did not start listening on {addr}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(registry)
    }

    /// `127.0.0.1:PORT/<repo>:<tag>`.
    pub fn reference(&self, repo_tag: &str) -> String {
        format!("{}/{repo_tag}", self.addr)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Pushes an OCI image layout archive (as `scripts/build-images.sh` writes,
/// tag `latest`) to `reference` with skopeo; returns its manifest digest.
pub fn push_oci_archive(archive: &std::path::Path, reference: &str) -> anyhow::Result<String> {
    let out = Command::new("skopeo")
        .args(["copy", "--quiet", "--dest-tls-verify=false", "--preserve-digests"])
        .arg(format!("oci-archive:{}:latest", archive.display()))
        .arg(format!("docker://{reference}"))
        .output()
        .context("running skopeo (scripts/deps.sh installs it)")?;
    anyhow::ensure!(out.status.success(), "skopeo copy failed: {}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new("skopeo").args(["inspect", "--tls-verify=false", "--format", "{{.Digest}}"]).arg(format!("docker://{reference}")).output()?;
    anyhow::ensure!(out.status.success(), "skopeo inspect failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// `sha256:<hex>` of bytes.
pub fn sha256(data: &[u8]) -> String {
    format!("sha256:{}", Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// Gzip-compresses a layer tar.
pub fn gzip(tar: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(tar).expect("gzip in memory");
    gz.finish().expect("gzip in memory")
}

/// An image to push: layer tars (uncompressed, base first) and config env.
#[derive(Default, Clone)]
pub struct TestImage {
    /// Layer tars, base first.
    pub layers: Vec<Vec<u8>>,
    /// `NAME=value` entries of the config.
    pub env: Vec<String>,
    /// Replaces the true diff ids (a lying config).
    pub diff_ids: Option<Vec<String>>,
}

impl TestImage {
    /// Pushes the image (gzip layers) as `reference` and returns its manifest digest.
    pub async fn push(&self, reference: &str) -> anyhow::Result<String> {
        let reference: Reference = reference.parse()?;
        let client = Client::new(ClientConfig { protocol: ClientProtocol::Http, ..ClientConfig::default() });
        let diff_ids = self.diff_ids.clone().unwrap_or_else(|| self.layers.iter().map(|l| sha256(l)).collect());
        let config = serde_json::json!({
            "architecture": "amd64", "os": "linux",
            "config": {"Env": self.env},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        });
        let layers: Vec<ImageLayer> =
            self.layers.iter().map(|tar| ImageLayer::new(gzip(tar), "application/vnd.oci.image.layer.v1.tar+gzip".into(), None)).collect();
        let config = Config::new(serde_json::to_vec(&config)?, "application/vnd.oci.image.config.v1+json".into(), None);
        client.push(&reference, &layers, config, &RegistryAuth::Anonymous, None).await.context("pushing a test image")?;
        let digest = client.fetch_manifest_digest(&reference, &RegistryAuth::Anonymous).await?;
        Ok(digest)
    }
}

/// Tar of `(path, content)` files (0644, root) and directories (paths
/// ending in `/`).
pub fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let entries: Vec<(tar::EntryType, &str, &[u8])> =
        files.iter().map(|(p, d)| (if p.ends_with('/') { tar::EntryType::Directory } else { tar::EntryType::Regular }, *p, *d)).collect();
    tar_entries(&entries)
}

/// Tar of `(kind, path, data)` entries written with raw headers, so tests
/// may express what no honest builder writes (`..`, absolute link
/// targets). For symlinks and hard links `data` is the link target.
pub fn tar_entries(entries: &[(tar::EntryType, &str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (kind, path, data) in entries {
        let link = kind.is_symlink() || kind.is_hard_link();
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
        if link {
            h.as_old_mut().linkname[..data.len()].copy_from_slice(data);
        }
        h.set_entry_type(*kind);
        h.set_mode(if kind.is_dir() || kind.is_symlink() { 0o755 } else { 0o644 });
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_size(if link { 0 } else { data.len() as u64 });
        h.set_cksum();
        b.append(&h, if link { &b""[..] } else { *data }).expect("tar in memory");
    }
    b.into_inner().expect("tar in memory")
}

/// A layer holding copies of host files: each path (file or directory
/// tree, compiled bytecode included, as in a real image) with every symlink on the way kept as a
/// symlink, so the layer resolves like the host. Enough to build a small
/// runnable image (bash, python) without a container daemon.
pub fn host_layer(paths: &[&str]) -> Vec<u8> {
    let mut layer = HostLayer { tar: tar::Builder::new(Vec::new()), seen: std::collections::HashSet::new() };
    for p in paths {
        layer.add(std::path::PathBuf::from(p));
    }
    layer.tar.into_inner().expect("tar in memory")
}

struct HostLayer {
    tar: tar::Builder<Vec<u8>>,
    seen: std::collections::HashSet<std::path::PathBuf>,
}


impl HostLayer {
    fn header(meta: &std::fs::Metadata, kind: tar::EntryType, size: u64) -> tar::Header {
        use std::os::unix::fs::MetadataExt;
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(meta.mode() & 0o7777);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(meta.mtime().max(0) as u64);
        h.set_size(size);
        h
    }

    fn add(&mut self, path: std::path::PathBuf) {
        let mut cur = std::path::PathBuf::from("/");
        let parts: Vec<_> = path.components().skip(1).collect();
        for (i, part) in parts.iter().enumerate() {
            let next = cur.join(part);
            let meta = std::fs::symlink_metadata(&next).unwrap_or_else(|e| panic!("{}: {e}", next.display()));
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&next).expect("readlink");
                if self.seen.insert(next.clone()) {
                    let mut h = Self::header(&meta, tar::EntryType::Symlink, 0);
                    self.tar.append_link(&mut h, next.strip_prefix("/").unwrap(), &target).expect("tar symlink");
                }
                let resolved = crate::lexical(&if target.is_absolute() { target } else { cur.join(target) });
                let rest: std::path::PathBuf = parts[i + 1..].iter().collect();
                return self.add(resolved.join(rest));
            }
            cur = next;
        }
        self.add_real(&cur);
    }

    fn add_real(&mut self, path: &std::path::Path) {
        if !self.seen.insert(path.to_path_buf()) {
            return;
        }
        let meta = std::fs::symlink_metadata(path).expect("stat");
        let rel = path.strip_prefix("/").unwrap();
        if meta.is_dir() {
            let mut h = Self::header(&meta, tar::EntryType::Directory, 0);
            self.tar.append_data(&mut h, rel, std::io::empty()).expect("tar dir");
            let mut entries: Vec<_> = std::fs::read_dir(path).expect("read_dir").map(|e| e.unwrap().path()).collect();
            entries.sort();
            for entry in entries {
                let m = std::fs::symlink_metadata(&entry).expect("stat");
                if m.file_type().is_symlink() {
                    if self.seen.insert(entry.clone()) {
                        let mut h = Self::header(&m, tar::EntryType::Symlink, 0);
                        let target = std::fs::read_link(&entry).expect("readlink");
                        self.tar.append_link(&mut h, entry.strip_prefix("/").unwrap(), target).expect("tar symlink");
                    }
                } else {
                    self.add_real(&entry);
                }
            }
        } else if meta.is_file() {
            let mut h = Self::header(&meta, tar::EntryType::Regular, meta.len());
            self.tar.append_data(&mut h, rel, std::fs::File::open(path).expect("open")).expect("tar file");
        }
    }
}

/// A small runnable image from this machine's files: bash in the base
/// layer, Python 3 on top (no node).
pub fn bash_python_image() -> TestImage {
    let base = host_layer(&["/usr/bin/bash", "/bin/sh", "/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libtinfo.so.6", "/lib/x86_64-linux-gnu/libselinux.so.1", "/lib/x86_64-linux-gnu/libpcre2-8.so.0", "/usr/bin/cat", "/usr/bin/id"]);
    let python = host_layer(&[
        "/usr/bin/python3",
        "/usr/lib/python3.11",
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/lib/x86_64-linux-gnu/libz.so.1",
        "/lib/x86_64-linux-gnu/libexpat.so.1",
    ]);
    TestImage { layers: vec![base, python], env: vec!["IMAGE_FLAVOUR=lite".into()], ..TestImage::default() }
}
