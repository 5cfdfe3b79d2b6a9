//! The link fixture against real sockets: each fault does what it names to the packets of
//! its own port, and nothing to any other port, and leaves no rule behind.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use test_support::net::{Direction, Link, leftover_rules};

const MS: fn(u64) -> Duration = Duration::from_millis;

/// An echo server on a port of its own; every byte it reads is also reported on the
/// channel, so a test can tell "the request arrived" from "the answer came back".
fn echo_server() -> (SocketAddr, mpsc::Receiver<u8>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, arrivals) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            stream.set_nodelay(true).unwrap();
            let seen = seen.clone();
            std::thread::spawn(move || {
                let mut byte = [0_u8; 1];
                while let Ok(1) = stream.read(&mut byte) {
                    let _ = seen.send(byte[0]);
                    if stream.write_all(&byte).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, arrivals)
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect_timeout(&addr, MS(2000)).expect("connects");
    stream.set_nodelay(true).unwrap();
    stream
}

/// Sends one byte and waits up to `patience` for it to come back; the round trip.
fn round_trip(stream: &mut TcpStream, byte: u8, patience: Duration) -> Option<Duration> {
    let started = Instant::now();
    stream.write_all(&[byte]).unwrap();
    stream.set_read_timeout(Some(patience)).unwrap();
    let mut back = [0_u8; 1];
    match stream.read(&mut back) {
        Ok(1) => {
            assert_eq!(back[0], byte);
            Some(started.elapsed())
        }
        Ok(_) => panic!("the server closed the connection"),
        Err(err) if matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => None,
        Err(err) => panic!("read failed: {err}"),
    }
}

/// Whether a new connection completes within `patience` (a refusal would be an error,
/// not a timeout: a silent link makes connect hang).
fn connects_within(addr: SocketAddr, patience: Duration) -> bool {
    match TcpStream::connect_timeout(&addr, patience) {
        Ok(_) => true,
        Err(err) if err.kind() == ErrorKind::TimedOut => false,
        Err(err) => panic!("connect failed loudly instead of timing out: {err}"),
    }
}

fn our_rules(port: u16) -> Vec<String> {
    let chain = format!("dpnet-{port}");
    leftover_rules()
        .unwrap()
        .into_iter()
        .filter(|rule| rule.contains(&chain))
        .collect()
}

#[test]
fn a_partition_loses_every_packet_both_ways_silently_and_heals() {
    if !test_support::net::can_cut_links() {
        return;
    }
    let (addr, arrivals) = echo_server();
    let mut stream = connect(addr);
    assert!(round_trip(&mut stream, b'a', MS(1000)).is_some());
    let link = Link::to(addr.port());
    link.partition();
    assert_eq!(round_trip(&mut stream, b'b', MS(300)), None, "no answer");
    assert!(
        arrivals.recv_timeout(MS(100)).is_ok(),
        "the first byte arrived"
    );
    assert!(
        arrivals.try_recv().is_err(),
        "the byte sent during the partition did not arrive"
    );
    assert!(!connects_within(addr, MS(300)), "a new connection hangs");
    link.heal();
    // TCP retransmits what was lost: the byte arrives and comes back.
    stream.set_read_timeout(Some(MS(5000))).unwrap();
    let mut back = [0_u8; 1];
    stream
        .read_exact(&mut back)
        .expect("the echo after the heal");
    assert_eq!(back[0], b'b');
    assert!(connects_within(addr, MS(1000)));
}

#[test]
fn a_lost_direction_lets_requests_arrive_and_no_answer_come_back() {
    if !test_support::net::can_cut_links() {
        return;
    }
    let (addr, arrivals) = echo_server();
    let mut stream = connect(addr);
    assert!(round_trip(&mut stream, b'a', MS(1000)).is_some());
    let _ = arrivals.recv_timeout(MS(100));
    let link = Link::to(addr.port());
    link.cut(Direction::ToClient);
    assert_eq!(round_trip(&mut stream, b'b', MS(300)), None);
    assert_eq!(
        arrivals.recv_timeout(MS(1000)),
        Ok(b'b'),
        "the request reached the server"
    );
}

#[test]
fn dropped_syns_stop_new_connections_and_spare_open_ones() {
    if !test_support::net::can_cut_links() {
        return;
    }
    let (addr, _arrivals) = echo_server();
    let mut open = connect(addr);
    let link = Link::to(addr.port());
    link.drop_new_connections();
    assert!(!connects_within(addr, MS(400)), "a new connection hangs");
    assert!(
        round_trip(&mut open, b'a', MS(1000)).is_some(),
        "an open connection still works"
    );
}

#[test]
fn a_delay_holds_each_packet_in_the_kernel_for_its_time() {
    if !test_support::net::can_cut_links() {
        return;
    }
    let (addr, _arrivals) = echo_server();
    let mut stream = connect(addr);
    let fast = round_trip(&mut stream, b'a', MS(1000)).expect("an echo");
    let link = Link::to(addr.port());
    link.delay(Direction::Both, MS(60), Duration::ZERO);
    // Each way waits 60 ms: the request, then the answer.
    for byte in [b'b', b'c', b'd'] {
        let slow = round_trip(&mut stream, byte, MS(2000)).expect("a delayed echo");
        assert!(slow >= MS(120), "a round trip of {slow:?} under 2 x 60 ms");
        assert!(slow < MS(120) + MS(250), "a round trip of {slow:?}");
    }
    link.heal();
    let healed = round_trip(&mut stream, b'e', MS(1000)).expect("an echo");
    assert!(
        healed < MS(60),
        "{healed:?} after the heal (before: {fast:?})"
    );
}

#[test]
fn jitter_spreads_the_delay_around_its_middle() {
    if !test_support::net::can_cut_links() {
        return;
    }
    let (addr, _arrivals) = echo_server();
    let mut stream = connect(addr);
    let link = Link::to(addr.port());
    link.delay(Direction::ToServer, MS(100), MS(50));
    let trips: Vec<Duration> = (0..12)
        .map(|i| round_trip(&mut stream, i, MS(2000)).expect("a delayed echo"))
        .collect();
    assert!(trips.iter().all(|t| *t >= MS(50)), "{trips:?}");
    assert!(trips.iter().all(|t| *t < MS(150) + MS(250)), "{trips:?}");
    let spread = trips
        .iter()
        .max()
        .unwrap()
        .saturating_sub(*trips.iter().min().unwrap());
    assert!(spread >= MS(20), "no jitter to be seen: {trips:?}");
}

#[test]
fn losing_every_packet_is_a_partition_and_losing_none_is_no_fault() {
    if !test_support::net::can_cut_links() {
        return;
    }
    let (addr, _arrivals) = echo_server();
    let mut stream = connect(addr);
    let link = Link::to(addr.port());
    link.lose(Direction::Both, 0.0);
    assert!(round_trip(&mut stream, b'a', MS(1000)).is_some());
    link.heal();
    link.lose(Direction::Both, 1.0);
    assert_eq!(round_trip(&mut stream, b'b', MS(300)), None);
}

#[test]
fn a_link_touches_only_its_own_port() {
    if !test_support::net::can_cut_links() {
        return;
    }
    let (cut_addr, _a) = echo_server();
    let (other_addr, _b) = echo_server();
    let mut cut = connect(cut_addr);
    let mut other = connect(other_addr);
    let link = Link::to(cut_addr.port());
    link.partition();
    assert_eq!(round_trip(&mut cut, b'a', MS(300)), None);
    assert!(round_trip(&mut other, b'a', MS(1000)).is_some());
    assert!(connects_within(other_addr, MS(1000)));
}

#[test]
fn a_second_link_to_the_same_port_is_refused_while_the_first_lives() {
    if !test_support::net::can_cut_links() {
        return;
    }
    let (addr, _arrivals) = echo_server();
    let _first = Link::to(addr.port());
    let second = std::panic::catch_unwind(|| Link::to(addr.port()));
    assert!(second.is_err(), "two links to one port");
}

#[test]
fn a_dropped_link_leaves_no_rule_even_when_its_test_panics() {
    if !test_support::net::can_cut_links() {
        return;
    }
    let (addr, _arrivals) = echo_server();
    let port = addr.port();
    let failed = std::panic::catch_unwind(|| {
        let link = Link::to(port);
        link.partition();
        link.delay(Direction::Both, MS(10), Duration::ZERO);
        assert!(!our_rules(port).is_empty());
        panic!("the test fails with its link cut");
    });
    assert!(failed.is_err());
    assert_eq!(our_rules(port), Vec::<String>::new());
    let mut stream = connect(addr);
    assert!(
        round_trip(&mut stream, b'a', MS(1000)).is_some(),
        "the link works again"
    );
}
