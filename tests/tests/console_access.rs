//! The console's authorization on a real API server (kube-envtest): the
//! cluster's own RBAC decides, through SubjectAccessReviews, which
//! namespaces a signed-in user sees and what they may change. Two users in
//! different groups, bound by a RoleBinding and a ClusterRoleBinding.

use warren_api_gateway::console::access::ClusterAccess;
use warren_api_gateway::console::oidc::Identity;
use warren_e2e::kube::{EnvTest, CONSOLE_RBAC as RBAC};
use warren_e2e::skip_unless_root;


fn who(user: &str, groups: &[&str]) -> Identity {
    Identity { subject: user.into(), user: user.into(), groups: groups.iter().map(|g| g.to_string()).collect() }
}

#[tokio::test]
async fn each_user_sees_the_namespaces_rbac_gives_them_and_nothing_more() {
    // kube-envtest (like every API-server test here) runs as root.
    if skip_unless_root("each_user_sees_the_namespaces_rbac_gives_them_and_nothing_more") {
        return;
    }
    let k = EnvTest::start().expect("kube-envtest");
    let dir = tempfile::tempdir().unwrap();
    let rbac = dir.path().join("rbac.yaml");
    std::fs::write(&rbac, RBAC).unwrap();
    k.kubectl_ok(&["apply", "-f", rbac.to_str().unwrap()]);
    let kubeconfig = kube::config::Kubeconfig::read_from(k.kubeconfig_for_rustls()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.unwrap();
    let access = ClusterAccess::new(kube::Client::try_from(config).unwrap());
    let all = vec!["team-a".to_string(), "team-b".to_string()];
    let ada = who("ada@example.test", &["platform-admins"]);
    let bob = who("bob@example.test", &["team-a"]);
    assert_eq!(access.visible(&ada, &all).await.unwrap(), all, "an admin sees every namespace");
    assert_eq!(access.visible(&bob, &all).await.unwrap(), ["team-a"], "a tenant sees their own");
    assert!(access.visible(&who("team-a", &[]), &all).await.unwrap().is_empty(), "a user named like a group is not in it");
    assert!(access.visible(&who("mallory@example.test", &[]), &all).await.unwrap().is_empty());
    assert!(access.may(&ada, "patch", "apikeys", "team-b").await.unwrap(), "admins may disable a key");
    assert!(!access.may(&bob, "patch", "apikeys", "team-a").await.unwrap(), "viewing is not changing");
    assert!(!access.may(&bob, "get", "apikeys", "team-b").await.unwrap());
}
