//! The spawner of per-sandbox supervisors; started by `warren-node-agent`,
//! never by hand.

fn main() {
    warren_isolation::sandbox::spawner_main()
}
