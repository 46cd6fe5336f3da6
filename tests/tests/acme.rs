//! cert-manager's HTTP-01 self-check, end to end. Before it asks the ACME server to
//! validate, cert-manager checks from its own pod that
//! `http://<domain>/.well-known/acme-challenge/<token>` answers the key
//! authorization: the domain resolves through public DNS to the LoadBalancer's
//! address, kube-proxy short-circuits the connection to the ingress, and an ingress
//! that requires the PROXY header drops it, so the check fails and the certificate
//! is never issued (the classic hairpin failure).
//!
//! Here: a DNS server (dnsmasq) answers the public names with the LB addresses, as
//! public DNS would, and the pod's resolver asks it (its own /etc/resolv.conf, in a
//! private mount namespace); the ingress is nginx requiring the header on port 80 and
//! routing `/.well-known/acme-challenge/` to the solver (cert-manager's acmesolver
//! pod, here an nginx server that answers its one token). The check fails without
//! hairpin and passes through it, on the default path and on `path: relay`.

use std::{fs, process::Stdio};

use hairpin_tests::{
    agent::Agent,
    client::Reply,
    node::{NGINX_PP_PORT, NODE_IP4, POD_IP4, SimNode},
    require_privileges,
    servers::{Server, nginx_conf, run_nginx},
    sh::{command_in, output_in, sh_with_files_over},
    wait::{eventually, wait_until},
};

/// The public name on the default path, and its LB (v1).
const DOMAIN: (&str, &str) = ("shop.example.com", "203.0.113.10");
/// A public name whose Service asks for the relay, and its LB (v2).
const DOMAIN_RELAY: (&str, &str) = ("pay.example.com", "203.0.113.12");

const FRONTENDS: &str = "frontends:\n\
    - ip: \"203.0.113.10\"\n  ports: [80]\n  proxyProtocol: v1\n\
    - ip: \"203.0.113.12\"\n  ports: [80]\n  proxyProtocol: v2\n  path: relay\n";

/// The challenge's token, and the ACME account key's thumbprint (RFC 8555, 8.1).
const TOKEN: &str = "evaGxfADs6pSRb2LAv9IZf17Dt3juxGJ-PCt92wr-oA";
const THUMBPRINT: &str = "nP1qzpXGymHBrUEepNY9HCsQk7K8KhOypzEY2O5pB9A";

/// Where the solver listens in the ingress pod's namespace.
const SOLVER_PORT: u16 = 8089;

fn key_authorization() -> String {
    format!("{TOKEN}.{THUMBPRINT}")
}

/// The ingress: port 80 requires the PROXY header and sends the challenge path to the
/// solver, logging what the header said; the solver answers the key authorization for
/// its token and 404 for anything else.
fn start_ingress(node: &SimNode) -> Server {
    let dir = node.dir.join("acme-nginx");
    fs::create_dir_all(dir.join("tmp")).expect("nginx dir");
    let http = format!(
        r#"    log_format pp 'pp_client=$proxy_protocol_addr pp_dst=$proxy_protocol_server_addr:$proxy_protocol_server_port host=$host "$request" $status';
    access_log {d}/access.log pp;
    server {{
        listen {NGINX_PP_PORT} proxy_protocol;
        listen [::]:{NGINX_PP_PORT} proxy_protocol;
        location /.well-known/acme-challenge/ {{
            proxy_pass http://127.0.0.1:{SOLVER_PORT};
        }}
        location / {{
            return 404;
        }}
    }}
    server {{
        listen 127.0.0.1:{SOLVER_PORT};
        access_log off;
        location = /.well-known/acme-challenge/{TOKEN} {{
            return 200 "{key}";
        }}
        location / {{
            return 404;
        }}
    }}
"#,
        d = dir.display(),
        key = key_authorization(),
    );
    run_nginx(
        node,
        &dir,
        &nginx_conf(&dir, &http),
        &[NGINX_PP_PORT, SOLVER_PORT],
    )
}

/// dnsmasq on the node's address (the pod's route reaches it), answering the public
/// names with their LBs' addresses and nothing else; killed with the node.
fn start_dns(node: &SimNode) -> Server {
    let records: Vec<String> = [DOMAIN, DOMAIN_RELAY]
        .iter()
        .map(|(name, ip)| format!("--host-record={name},{ip}"))
        .collect();
    let listen = format!("--listen-address={NODE_IP4}");
    let mut argv = vec![
        "dnsmasq",
        "--keep-in-foreground",
        "--conf-file=/dev/null",
        "--no-resolv",
        "--no-hosts",
        "--bind-interfaces",
        &listen,
        "--pid-file=",
        "--user=root",
        "--log-queries",
        "--log-facility=-",
    ];
    argv.extend(records.iter().map(String::as_str));
    let mut cmd = command_in(&node.node_ns, None, &argv);
    cmd.stdin(Stdio::null());
    let server = Server::spawn(&mut cmd, node.dir.join("dnsmasq.log"), &[]);
    let answers = wait_until(std::time::Duration::from_secs(5), || {
        let out = output_in(&node.node_ns, None, &["ss", "-Hlun"]);
        String::from_utf8_lossy(&out.stdout).contains(&format!("{NODE_IP4}:53 "))
    });
    assert!(
        answers.is_some(),
        "dnsmasq never listened:\n{}",
        server.log()
    );
    server
}

/// cert-manager's self-check from the pod: resolve `domain` through the pod's
/// resolver (its resolv.conf names the DNS server above) and GET the challenge
/// path; passes when the answer is 200 with the key authorization.
fn self_check(node: &SimNode, domain: &str) -> Result<Reply, Reply> {
    let resolv = node.dir.join("pod-resolv.conf");
    fs::write(&resolv, format!("nameserver {NODE_IP4}\n")).expect("resolv.conf");
    let script = format!(
        "exec curl -sS --max-time 10 -A cert-manager-challenges -w '\\n%{{http_code}}' \
         http://{domain}/.well-known/acme-challenge/{TOKEN}"
    );
    let reply = Reply::from_output(sh_with_files_over(
        &node.pod_ns,
        &node.pod_cgroup(),
        &[(&resolv, "/etc/resolv.conf")],
        &script,
    ));
    let passed = reply.ok() && reply.body.trim_end() == format!("{}\n200", key_authorization());
    if passed { Ok(reply) } else { Err(reply) }
}

#[test]
fn cert_manager_http01_self_check_passes_only_through_hairpin() {
    require_privileges!();
    let node = SimNode::new();
    let ingress = start_ingress(&node);
    let dns = start_dns(&node);
    let access = || fs::read_to_string(node.dir.join("acme-nginx/access.log")).unwrap_or_default();

    // Without hairpin the name resolves and the connection reaches the ingress,
    // which finds no header: the self-check fails.
    for (n, (domain, _)) in [DOMAIN, DOMAIN_RELAY].into_iter().enumerate() {
        let failed = self_check(&node, domain).expect_err("the check must fail without hairpin");
        let broken = |l: &str| l.matches("broken header").count() > n;
        let errors = eventually(|| ingress.log(), broken);
        assert!(
            broken(&errors),
            "{domain}: {failed:?}\nnginx:\n{errors}\ndns:\n{}",
            dns.log()
        );
    }
    assert!(
        dns.log().contains(&format!("query[A] {} from", DOMAIN.0)),
        "the pod asked the DNS server:\n{}",
        dns.log()
    );

    // Through hairpin, on its defaults: the check passes, and the ingress saw the
    // pod's address and the LB it dialled, as the cloud LB would have sent them.
    let agent = Agent::start_with_frontends_yaml(&node, FRONTENDS, &["--kernel-path", "auto"]);
    for (domain, lb) in [DOMAIN, DOMAIN_RELAY] {
        let passed = self_check(&node, domain).unwrap_or_else(|r| {
            panic!(
                "{domain}: the self-check fails through hairpin: {r:?}\nnginx:\n{}\n{}\nagent:\n{}",
                access(),
                ingress.log(),
                agent.log()
            )
        });
        let line = format!(
            "pp_client={POD_IP4} pp_dst={lb}:80 host={domain} \"GET /.well-known/acme-challenge/{TOKEN} HTTP/1.1\" 200"
        );
        let log = eventually(access, |l| l.contains(&line));
        assert!(log.contains(&line), "{domain}: {passed:?}\n{log}");
    }
}
