//! Keeps the committed generated code identical to what the .proto produces.

use std::path::PathBuf;

#[test]
fn generated_code_matches_proto() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let fds = protox::compile(["warren/agent/v1/agent.proto"], [&root]).expect("proto compiles");
    let out = tempfile::tempdir().expect("tempdir");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .skip_debug(["warren.agent.v1.Credentials"])
        .out_dir(out.path())
        .compile_fds(fds)
        .expect("codegen");
    let fresh = std::fs::read_to_string(out.path().join("warren.agent.v1.rs")).expect("generated file");
    let committed_path = root.join("src/gen/warren.agent.v1.rs");
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    if fresh != committed {
        if std::env::var_os("WARREN_UPDATE_GENERATED").is_some() {
            std::fs::write(&committed_path, fresh).expect("write generated code");
        } else {
            panic!(
                "proto/src/gen/warren.agent.v1.rs is stale; run \
                 `WARREN_UPDATE_GENERATED=1 cargo test -p warren-proto` and commit it"
            );
        }
    }
}
