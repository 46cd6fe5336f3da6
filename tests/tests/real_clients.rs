//! Real clients, in the languages and socket styles workloads use, through the
//! default configuration under only the DaemonSet's capabilities: each gets the
//! exact header from the kernel path (nginx echoes the true client), none is missed,
//! none needs the relay. A client that sent data while its socket was still
//! connecting would show up here as a `kernel_missed_data_first`.

use hairpin_tests::{
    agent::{CappedAgent, DAEMONSET_CAPS, all_frontends, status},
    node::{POD_IP4, POD_IP6, SimNode},
    require_privileges,
    servers::{nginx_access_log, start_nginx},
    sh::output_in,
};

/// A Java client (java.net.http.HttpClient), run from source by `java`.
const JAVA: &str = r#"
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
public class Get {
    public static void main(String[] a) throws Exception {
        HttpClient c = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();
        HttpRequest r = HttpRequest.newBuilder(URI.create(a[0])).build();
        System.out.print(c.send(r, HttpResponse.BodyHandlers.ofString()).body());
    }
}
"#;

/// Each client: its name and the command that fetches `http://LB/` and prints the body.
fn clients(lb: &str, java_file: &str) -> Vec<(&'static str, Vec<String>)> {
    let host = if lb.contains(':') {
        format!("[{lb}]")
    } else {
        lb.to_string()
    };
    let url = format!("http://{host}/");
    let family = if lb.contains(':') {
        "AF_INET6"
    } else {
        "AF_INET"
    };
    let req = r"GET / HTTP/1.0\r\nHost: lb\r\n\r\n";
    let py = |code: String| vec!["python3".to_string(), "-c".to_string(), code];
    vec![
        (
            "curl",
            vec![
                "curl".into(),
                "-sS".into(),
                "--max-time".into(),
                "5".into(),
                url.clone(),
            ],
        ),
        (
            "wget",
            vec![
                "wget".into(),
                "-qO-".into(),
                "--timeout=5".into(),
                url.clone(),
            ],
        ),
        (
            "python urllib",
            py(format!(
                "import urllib.request;print(urllib.request.urlopen('{url}', timeout=5).read().decode())"
            )),
        ),
        (
            "python http.client",
            py(format!(
                "import http.client;c=http.client.HTTPConnection('{lb}',80,timeout=5);c.request('GET','/');print(c.getresponse().read().decode())"
            )),
        ),
        (
            "python blocking socket",
            py(format!(
                "import socket\ns=socket.create_connection(('{lb}',80),5)\ns.sendall(b'{req}')\nb=b''\nwhile True:\n  d=s.recv(4096)\n  if not d: break\n  b+=d\nprint(b.split(b'\\r\\n\\r\\n',1)[1].decode())"
            )),
        ),
        (
            "python non-blocking socket",
            py(format!(
                "import socket,select\ns=socket.socket(socket.{family});s.setblocking(False)\ns.connect_ex(('{lb}',80))\nselect.select([],[s],[],5)\ns.setblocking(True);s.settimeout(5)\ns.sendall(b'{req}')\nb=b''\nwhile True:\n  d=s.recv(4096)\n  if not d: break\n  b+=d\nprint(b.split(b'\\r\\n\\r\\n',1)[1].decode())"
            )),
        ),
        (
            "python asyncio",
            py(format!(
                "import asyncio\nasync def m():\n  r,w=await asyncio.open_connection('{lb}',80)\n  w.write(b'{req}');await w.drain()\n  b=await r.read()\n  print(b.split(b'\\r\\n\\r\\n',1)[1].decode())\nasyncio.run(m())"
            )),
        ),
        (
            "perl IO::Socket::IP",
            vec![
                "perl".into(),
                "-MIO::Socket::IP".into(),
                "-e".into(),
                format!(
                    "my $s=IO::Socket::IP->new(PeerHost=>'{lb}',PeerPort=>80,Timeout=>5) or die $@; print $s \"{req}\"; local $/; my $r=<$s>; $r=~s/.*?\\r\\n\\r\\n//s; print $r"
                ),
            ],
        ),
        (
            "node http",
            vec![
                "node".into(),
                "-e".into(),
                format!(
                    "require('http').get('{url}',r=>{{let b='';r.on('data',d=>b+=d);r.on('end',()=>console.log(b))}})"
                ),
            ],
        ),
        (
            "java HttpClient",
            vec!["java".into(), java_file.to_string(), url.clone()],
        ),
        (
            "bash /dev/tcp",
            vec![
                "bash".into(),
                "-c".into(),
                format!("exec 3<>/dev/tcp/{lb}/80; printf '{req}' >&3; sed '1,/^\\r$/d' <&3"),
            ],
        ),
    ]
}

#[test]
fn real_clients_get_their_header_from_the_kernel_with_the_daemonsets_capabilities() {
    require_privileges!();
    let node = SimNode::new();
    let _nginx = start_nginx(&node);
    let java_file = node.dir.join("Get.java");
    std::fs::write(&java_file, JAVA).expect("java source");
    // Default flags, only the DaemonSet's capabilities.
    let agent = CappedAgent::start(&node, &all_frontends(), &[], &DAEMONSET_CAPS);
    let s = status(&node);
    assert_eq!(s["kernel_path"]["state"], "on", "{s}\n{}", agent.log());
    let mut n = 0;
    for (lb, ip) in [("203.0.113.10", POD_IP4), ("2001:db8:ffff::12", POD_IP6)] {
        for (name, argv) in clients(lb, java_file.to_str().expect("utf-8")) {
            let args: Vec<&str> = argv.iter().map(String::as_str).collect();
            let out = output_in(&node.pod_ns, Some(&node.pod_cgroup()), &args);
            let body = String::from_utf8_lossy(&out.stdout);
            assert!(
                body.trim_start().starts_with(&format!("client={ip}:"))
                    && body.contains(&format!("dst={lb}:80")),
                "{name} -> {lb}: {body:?} {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                agent.log()
            );
            n += 1;
        }
    }
    // TLS: openssl's ClientHello goes out behind the header (nginx, speaking plain
    // HTTP here, answers 400 but logs the header's client).
    let out = output_in(
        &node.pod_ns,
        Some(&node.pod_cgroup()),
        &[
            "bash",
            "-c",
            "openssl s_client -connect 203.0.113.10:80 -servername lb </dev/null >/dev/null 2>&1; true",
        ],
    );
    assert!(out.status.success());
    n += 1;
    // nginx logs the request once it has finalised it, which may be just after the
    // client saw the connection close.
    let logged = |a: &str| {
        a.lines()
            .any(|l| l.contains(&format!("pp_client={POD_IP4}:")) && l.contains("\" 400 "))
    };
    let access = hairpin_tests::wait::eventually(|| nginx_access_log(&node), logged);
    assert!(
        logged(&access),
        "the TLS client's connection must carry the header:\n{access}"
    );
    let s = status(&node);
    let counter = |name: &str| s["counters"]["kernel"][name].as_u64().unwrap_or(0);
    assert_eq!(counter("kernel_headers_written"), n, "{s}");
    for (name, value) in s["counters"]["kernel"].as_object().expect("counters") {
        if name.starts_with("kernel_missed_") || name.starts_with("kernel_fallback_") {
            assert_eq!(value.as_u64(), Some(0), "{name}: {s}");
        }
    }
    assert_eq!(counter("redirected"), 0, "{s}");
}
