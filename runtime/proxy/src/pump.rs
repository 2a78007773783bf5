//! Relaying bytes both ways with fixed buffers, byte counters and an idle timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// Per-direction buffer size: the whole memory a relayed connection holds, twice.
const BUF_SIZE: usize = 64 * 1024;

/// Bytes relayed so far and the time of the last activity, readable while the relay runs.
#[derive(Debug)]
pub(crate) struct Counters {
    pub(crate) up: AtomicU64,
    pub(crate) down: AtomicU64,
    last_activity_ms: AtomicU64,
    start: Instant,
}

impl Counters {
    pub(crate) fn new() -> Self {
        Self {
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            last_activity_ms: AtomicU64::new(0),
            start: Instant::now(),
        }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn touch(&self) {
        self.last_activity_ms
            .store(self.elapsed_ms(), Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let last = self.last_activity_ms.load(Ordering::Relaxed);
        Duration::from_millis(self.elapsed_ms().saturating_sub(last))
    }
}

/// How a relay ended.
#[derive(Debug)]
pub(crate) enum PumpEnd {
    /// Both sides closed their sending half.
    Closed,
    /// Nothing moved for the idle timeout.
    Idle,
    /// A read or write failed (reset, broken pipe).
    Failed(std::io::Error),
}

async fn one_way<R, W>(
    mut from: R,
    mut to: W,
    count: &AtomicU64,
    counters: &Counters,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    // Reserved, not zero-filled: memory pages are only touched as data actually passes, so
    // a quiet connection costs a page or two rather than the whole buffer.
    let mut buf: Vec<u8> = Vec::with_capacity(BUF_SIZE);
    loop {
        buf.clear();
        let n = from.read_buf(&mut buf).await?;
        if n == 0 {
            // Pass the half-close on; the other direction keeps going.
            return to.shutdown().await;
        }
        to.write_all(&buf).await?;
        count.fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
        counters.touch();
    }
}

/// Relays between `client` and `upstream` until both sides are done, one fails, or nothing
/// moves for `idle`.
pub(crate) async fn pump(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    idle: Duration,
    counters: &Counters,
) -> PumpEnd {
    counters.touch();
    let (cr, cw) = client.split();
    let (ur, uw) = upstream.split();
    let both = async {
        tokio::try_join!(
            one_way(cr, uw, &counters.up, counters),
            one_way(ur, cw, &counters.down, counters)
        )
    };
    let watchdog = async {
        let tick = (idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(5));
        loop {
            tokio::time::sleep(tick).await;
            if counters.idle_for() >= idle {
                return;
            }
        }
    };
    tokio::select! {
        result = both => match result {
            Ok(_) => PumpEnd::Closed,
            Err(e) => PumpEnd::Failed(e),
        },
        () = watchdog => PumpEnd::Idle,
    }
}
