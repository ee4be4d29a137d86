//! Cluster mode: keys come from the effective configurations the operator
//! publishes (labelled Secrets in Warren's namespace), watched and applied
//! within moments, without restart.

use std::sync::Arc;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use warren_config::watch::ShortBackoff;
use tracing::{info, warn};
use warren_config::published;

use crate::auth::KeyStore;

/// Watches published keys in `namespace` and publishes a new [`KeyStore`]
/// after every change. Runs until the task is dropped.
pub async fn watch_loop(client: Client, namespace: String, tx: watch::Sender<Arc<KeyStore>>) {
    let api: Api<Secret> = Api::namespaced(client, &namespace);
    let wc = watcher::Config::default().labels(&format!("{}=true", published::LABEL));
    let (reader, writer) = reflector::store();
    let events = reflector(writer, watcher(api, wc)).backoff(ShortBackoff::default());
    tokio::pin!(events);
    let mut last_count = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::InitApply(_)) | Ok(watcher::Event::Init) => continue, // wait for InitDone
            Ok(_) => {
                let secrets = reader.state();
                let keys: Vec<_> = secrets.iter().filter_map(|s| decode(s)).collect();
                let store = KeyStore::new(keys);
                if last_count != Some(store.key_count()) {
                    info!(keys = store.key_count(), namespace = %namespace, "published keys loaded");
                    last_count = Some(store.key_count());
                }
                tx.send_replace(Arc::new(store));
            }
            Err(e) => warn!(error = %e, "watching published keys failed; retrying"),
        }
    }
}

fn decode(s: &Secret) -> Option<warren_config::EffectiveKey> {
    let data = s.data.as_ref()?.get(published::DATA_KEY)?;
    match published::decode(&data.0) {
        Ok(k) => Some(k),
        Err(e) => {
            warn!(secret = %s.name_any(), error = %e, "published key is not readable; skipped");
            None
        }
    }
}
