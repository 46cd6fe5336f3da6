//! The API server gone for two minutes: redirects keep working, a later change applies.

use super::*;

/// How long the API server stays down. Two minutes: the case mostly waits, so it
/// runs beside the others rather than holding [`serial`].
const API_OUTAGE: Duration = Duration::from_secs(120);

/// The API server answers 500 to everything for two minutes: the redirects already
/// applied keep working throughout (checked every 5 s from the pod and the node),
/// the agent stays up, and once the server is back a new Service is applied.
// Fake API: 500 to every call for two minutes at a chosen step (real_cluster/restart.rs kills the real server and etcd instead).
#[test]
fn two_minutes_without_the_api_server_keep_redirects_and_a_later_change_applies() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let api = FakeApi::start_in_netns(&node.node_ns);
    let kubeconfig = api.node_kubeconfig(&node);
    api.apply(digitalocean_service());
    let mut agent = Agent::start_kube(&node, &kubeconfig, &[]);
    agent.wait_for_log("agent ready", Duration::from_secs(20));
    let first = url("203.0.113.10", 80, "/");
    let ok = wait_until(Duration::from_secs(10), || from_pod(&node, &first).ok());
    assert!(
        ok.is_some(),
        "not proxied before the outage\nagent:\n{}",
        agent.log()
    );

    api.set_down(true);
    let down_at = Instant::now();
    let mut checks = 0;
    let mut source_error = None;
    while down_at.elapsed() < API_OUTAGE {
        for (who, reply, client) in [
            ("pod", from_pod(&node, &first), POD_IP4),
            ("node", from_host(&node, &first), NODE_IP4),
        ] {
            assert!(
                reply.ok() && reply.body.starts_with(&format!("client={client}:")),
                "{who} after {:?} without the API server: {reply:?}\nagent:\n{}",
                down_at.elapsed(),
                agent.log()
            );
        }
        checks += 1;
        if source_error.is_none() {
            source_error = cli_status(&node)["sources"][0]["last_error"]
                .as_str()
                .map(String::from);
        }
        std::thread::sleep(Duration::from_secs(5));
    }
    api.set_down(false);
    let up_at = Instant::now();
    assert!(
        from_pod(&node, &first).ok(),
        "after recovery\nagent:\n{}",
        agent.log()
    );

    // A change made after recovery: a second LB (203.0.113.12, DNATed to nginx too).
    let mut second = digitalocean_service();
    second["metadata"]["name"] = serde_json::json!("ingress-nginx-second");
    second["status"]["loadBalancer"]["ingress"][0]["ip"] = serde_json::json!("203.0.113.12");
    api.apply(second);
    let second_url = url("203.0.113.12", 80, "/");
    let applied = wait_until(Duration::from_secs(90), || {
        from_pod(&node, &second_url).ok()
    });
    let pid_alive = std::path::Path::new(&format!("/proc/{}", agent.pid())).exists();
    eprintln!(
        "API server down {API_OUTAGE:?}: {checks} checks from pod and node all relayed; status \
         said {source_error:?}; change after recovery applied {:?} after the server came back",
        applied.map(|_| up_at.elapsed())
    );
    assert!(
        pid_alive,
        "the agent exited during the outage:\n{}",
        agent.log()
    );
    assert!(
        applied.is_some(),
        "a Service added after recovery was not applied\nagent:\n{}",
        agent.log()
    );
    assert!(source_error.is_some(), "status never reported the outage");
    assert!(from_pod(&node, &first).ok());
}
