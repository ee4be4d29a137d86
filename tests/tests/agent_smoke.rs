use std::time::Duration;
use warren_e2e::*;
use warren_proto::agent::Language;

#[tokio::test]
async fn smoke() {
    if skip_unless_root("smoke") { return; }
    let agent = Agent::start(&[]).await.unwrap();
    for (lang, code) in [(Language::Python, "print(1)"), (Language::Bash, "echo 1; id; echo err >&2"), (Language::Node, "console.log(1)")] {
        let r = agent.run(lang, code, Duration::from_secs(10)).await.unwrap();
        println!("{lang:?}: {r:?}");
    }
}
