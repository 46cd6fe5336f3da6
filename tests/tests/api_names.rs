//! The API server's names are found in its serving certificate (issue 22): in a
//! pod the cluster URL is the `kubernetes` ClusterIP and names nothing, so a
//! kubeadm `controlPlaneEndpoint` under a listed domain used to be publishable.
//! A TLS server on loopback (openssl s_server) with a certificate like kubeadm's
//! stands in for the API server.
//!
//! Issue 31: the certificate is read in the background and retried: an API server
//! that is down when the agent starts is read once it answers, and until then no
//! name is published at all.

use std::{
    net::{TcpListener, TcpStream},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use hairpin_agent::{
    k8s::{
        CertNames, apply_cert_names as apply, cert_names, read_cert_names,
        refuse_api_server_names as refuse,
    },
    names::{Hostname, NameScope, ScopeRule},
};

/// The server process and the directory holding its key (removed after it).
struct Server {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An openssl s_server on 127.0.0.1 presenting a certificate with kubeadm's SANs.
fn api_server_like() -> Option<(Server, u16)> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    api_server_like_on(port).map(|s| (s, port))
}

/// As [`api_server_like`], on `port`.
fn api_server_like_on(port: u16) -> Option<Server> {
    if Command::new("openssl").arg("version").output().is_err() {
        eprintln!("SKIPPED: no openssl binary to serve a certificate");
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_str().expect("utf-8").to_owned();
    let made = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
            "/CN=kube-apiserver", "-keyout", &format!("{d}/key.pem"), "-out",
            &format!("{d}/cert.pem"), "-addext",
            "subjectAltName=DNS:cp.example.com,DNS:kubernetes,DNS:kubernetes.default,\
             DNS:kubernetes.default.svc.cluster.local,DNS:control-plane-1,IP:10.96.0.1,IP:127.0.0.1",
        ])
        .output()
        .expect("openssl req");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let child = Command::new("openssl")
        .args([
            "s_server",
            "-quiet",
            "-accept",
            &format!("127.0.0.1:{port}"),
            "-cert",
            &format!("{d}/cert.pem"),
            "-key",
            &format!("{d}/key.pem"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl s_server");
    let server = Server { child, _dir: dir };
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "s_server did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(server)
}

#[tokio::test]
async fn the_certificates_names_and_the_flag_are_refused() {
    let Some((_server, port)) = api_server_like() else {
        return;
    };
    // As in a pod: the server is an address.
    let config = kube::Config::new(format!("https://127.0.0.1:{port}").parse().expect("url"));
    let names = cert_names(&config, Duration::from_secs(5))
        .await
        .expect("certificate names");
    assert_eq!(
        names,
        [
            "cp.example.com",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc.cluster.local",
            "control-plane-1"
        ]
    );
    let scope = NameScope::new(&["example.com", "example.net"], "cluster.local").expect("scope");
    let scope = apply(
        &refuse(scope, &config, &["api.example.net".to_string()]),
        &CertNames::Known(names),
    );
    let h = |s: &str| Hostname::parse(s).expect("name");
    for (name, what) in [
        ("cp.example.com", "a name of the API server's certificate"),
        ("*.example.com", "a name of the API server's certificate"),
        ("api.example.net", "an API server name (--api-server-names)"),
    ] {
        let r = scope.check(&h(name)).expect_err(name);
        assert_eq!(r.rule, ScopeRule::ApiServer, "{name}: {}", r.message);
        assert!(r.message.contains(what), "{name}: {}", r.message);
    }
    assert!(scope.check(&h("shop.example.com")).is_ok());
}

#[tokio::test]
async fn an_api_server_down_at_start_is_read_once_it_answers_and_no_name_is_published_before() {
    if Command::new("openssl").arg("version").output().is_err() {
        eprintln!("SKIPPED: no openssl binary to serve a certificate");
        return;
    }
    // Nothing listens on this port yet.
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let config = kube::Config::new(format!("https://127.0.0.1:{port}").parse().expect("url"));
    let started = Instant::now();
    let e = cert_names(&config, Duration::from_secs(2))
        .await
        .expect_err("nothing listens");
    assert!(
        e.to_string()
            .contains("failed to connect to the API server"),
        "{e}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));

    let mut rx = read_cert_names(config.clone());
    let scope = refuse(
        NameScope::new(&["example.com"], "cluster.local").expect("scope"),
        &config,
        &["flag.example.com".to_string()],
    );
    let h = |s: &str| Hostname::parse(s).expect("name");
    // Wait for the reader's first attempt to fail (nothing listens).
    let deadline = Instant::now() + Duration::from_secs(10);
    let pending = loop {
        let now = rx.borrow_and_update().clone();
        if matches!(&now, CertNames::Pending { last_error } if last_error.contains("failed to connect"))
        {
            break now;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            tokio::time::timeout(left, rx.changed()).await.is_ok(),
            "no failed attempt within 10 s: {now:?}"
        );
    };
    // While the certificate cannot be read, every name is withheld; the names
    // known without it still name their own rule.
    let withheld = apply(&scope, &pending);
    for name in ["shop.example.com", "cp.example.com"] {
        let r = withheld.check(&h(name)).expect_err(name);
        assert_eq!(r.rule, ScopeRule::ApiServerPending, "{name}: {}", r.message);
    }
    let r = withheld.check(&h("flag.example.com")).expect_err("flag");
    assert_eq!(r.rule, ScopeRule::ApiServer, "{}", r.message);

    // The API server comes up: the reader's retry (1 s, then 2 s, ...) reads it.
    let Some(_server) = api_server_like_on(port) else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    let names = loop {
        if let CertNames::Known(names) = rx.borrow_and_update().clone() {
            break names;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            tokio::time::timeout(left, rx.changed()).await.is_ok(),
            "the certificate was not read within 15 s of the server answering"
        );
    };
    assert!(names.iter().any(|n| n == "cp.example.com"), "{names:?}");
    let known = apply(&scope, &CertNames::Known(names));
    let r = known.check(&h("cp.example.com")).expect_err("cp");
    assert_eq!(r.rule, ScopeRule::ApiServer, "{}", r.message);
    assert!(known.check(&h("shop.example.com")).is_ok());
}
