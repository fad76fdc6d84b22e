//! Options that cannot work are typed errors when a lock, semaphore or cache
//! is built, never a silent surprise at run time; cache keys live in the
//! cache's namespace.

use lockwright_core::ProtocolId;
use lockwright_redis::{Cache, CacheOptions, Error, Lock, LockOptions, OptionsError, Semaphore};
use lockwright_tests::{raw, redis_or_skip};
use std::time::Duration;

/// A client for a port nothing is asked of: building a lock opens no
/// connection.
fn client() -> redis::Client {
    redis::Client::open("redis://127.0.0.1:1/").unwrap()
}

fn built(options: LockOptions) -> Result<(), Error> {
    Lock::new([client()], "opts", options).map(|_| ())
}

#[test]
fn a_request_timeout_not_below_the_ttl_is_refused() {
    let options = LockOptions {
        request_timeout: Duration::from_secs(1),
        ..LockOptions::new(ProtocolId::SetPxLua, Duration::from_millis(500))
    };
    assert_eq!(
        built(options),
        Err(Error::Options(OptionsError::RequestTimeoutNotBelowTtl {
            request_timeout: Duration::from_secs(1),
            ttl: Duration::from_millis(500),
        }))
    );
    let equal = LockOptions {
        request_timeout: Duration::from_millis(500),
        ..LockOptions::new(ProtocolId::SetPxLua, Duration::from_millis(500))
    };
    assert!(matches!(
        built(equal),
        Err(Error::Options(
            OptionsError::RequestTimeoutNotBelowTtl { .. }
        ))
    ));
}

#[test]
fn a_sub_millisecond_ttl_is_refused_as_such() {
    let options = LockOptions {
        request_timeout: Duration::from_micros(100),
        ..LockOptions::new(ProtocolId::SetPxLua, Duration::from_micros(500))
    };
    let err = built(options).unwrap_err();
    assert_eq!(
        err,
        Error::Options(OptionsError::SubMillisecondTtl {
            ttl: Duration::from_micros(500)
        })
    );
    assert!(err.to_string().contains("1 ms resolution"), "{err}");
}

#[test]
fn a_limit_on_a_lock_is_refused() {
    let options = LockOptions {
        limit: 3,
        ..LockOptions::new(ProtocolId::SetPxLua, Duration::from_secs(5))
    };
    assert_eq!(
        built(options),
        Err(Error::Options(OptionsError::LimitOnLock { limit: 3 }))
    );
    // On a semaphore it is what it is for.
    let sem = LockOptions {
        limit: 3,
        ..LockOptions::new(ProtocolId::LeaseSemaphore, Duration::from_secs(5))
    };
    assert!(Semaphore::new([client()], "opts", sem).is_ok());
}

#[test]
fn auto_renew_is_on_only_where_it_renews() {
    for protocol in ProtocolId::all() {
        let options = LockOptions::new(protocol, Duration::from_secs(5));
        let renews = matches!(
            protocol,
            ProtocolId::Reentrant
                | ProtocolId::Fenced
                | ProtocolId::TimeFenced
                | ProtocolId::LeaseSemaphore
                | ProtocolId::TimeFencedSemaphore
        );
        assert_eq!(options.auto_renew, renews, "{protocol}");
    }
    assert!(!LockOptions::default().auto_renew);
    let asked = LockOptions {
        auto_renew: true,
        ..LockOptions::new(ProtocolId::SetPxLua, Duration::from_secs(5))
    };
    assert_eq!(
        built(asked),
        Err(Error::Options(OptionsError::AutoRenewWithoutRenewal {
            protocol: ProtocolId::SetPxLua
        }))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_values_live_in_the_cache_namespace() {
    let Some(redis) = redis_or_skip("cache namespace") else {
        return;
    };
    let mut conn = redis.conn().await;
    // Someone else's key of the same name is neither read nor overwritten.
    let _: () = raw(&mut conn, redis::cmd("SET").arg("sku-9").arg("theirs")).await;
    let cache = Cache::new(redis.client(), "prices", CacheOptions::default()).unwrap();
    let value = cache
        .get_or_load("sku-9", || async {
            Ok::<_, std::io::Error>("ours".to_owned())
        })
        .await;
    assert_eq!(value, Ok("ours".to_owned()));
    let theirs: String = raw(&mut conn, redis::cmd("GET").arg("sku-9")).await;
    assert_eq!(theirs, "theirs");
    let ours: String = raw(&mut conn, redis::cmd("GET").arg("prices:sku-9")).await;
    assert_eq!(ours, "ours");
}

#[test]
fn a_cache_refuses_a_request_timeout_not_below_its_load_timeout() {
    let options = CacheOptions {
        load_timeout: Duration::from_millis(500),
        request_timeout: Duration::from_millis(500),
        ..CacheOptions::default()
    };
    assert_eq!(
        Cache::new(client(), "prices", options).err(),
        Some(Error::Options(OptionsError::RequestTimeoutNotBelowTtl {
            request_timeout: Duration::from_millis(500),
            ttl: Duration::from_millis(500),
        }))
    );
}
