//! Per-sandbox supervisor; started by `warren-node-agent`, never by hand.

fn main() {
    warren_isolation::sandbox::supervisor_main()
}
