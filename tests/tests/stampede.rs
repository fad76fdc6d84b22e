//! The cache-stampede helper against real Redis: one load per key however
//! many callers miss at once.

use lockwright_redis::{Cache, CacheOptions, Error};
use lockwright_tests::{raw, redis_or_skip};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_run_the_loader_once() {
    let Some(redis) = redis_or_skip("stampede") else {
        return;
    };
    let cache = Cache::new(redis.client(), "prices", CacheOptions::default()).unwrap();
    let loads = Arc::new(AtomicUsize::new(0));
    let callers: Vec<_> = (0..10)
        .map(|_| {
            let cache = cache.clone();
            let loads = loads.clone();
            tokio::spawn(async move {
                cache
                    .get_or_load("sku-1", || async move {
                        loads.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(150)).await;
                        Ok::<_, std::io::Error>("42".to_owned())
                    })
                    .await
            })
        })
        .collect();
    for caller in callers {
        assert_eq!(caller.await.unwrap(), Ok("42".to_owned()));
    }
    assert_eq!(loads.load(Ordering::SeqCst), 1, "single flight");
    let mut conn = redis.conn().await;
    let cached: String = raw(&mut conn, redis::cmd("GET").arg("prices:sku-1")).await;
    assert_eq!(cached, "42");
    // A hit never calls the loader.
    let hit = cache
        .get_or_load("sku-1", || async { Err::<String, _>("must not run") })
        .await;
    assert_eq!(hit, Ok("42".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_loader_is_a_typed_error_and_frees_the_key() {
    let Some(redis) = redis_or_skip("stampede failure") else {
        return;
    };
    let cache = Cache::new(redis.client(), "prices", CacheOptions::default()).unwrap();
    let failed = cache
        .get_or_load("sku-2", || async { Err::<String, _>("backend down") })
        .await;
    assert_eq!(failed, Err(Error::Load("backend down".into())));
    // The key's lock was released: the next caller loads at once.
    let next = tokio::time::timeout(
        Duration::from_millis(500),
        cache.get_or_load("sku-2", || async {
            Ok::<_, std::io::Error>("7".to_owned())
        }),
    )
    .await
    .expect("not blocked by the failed load");
    assert_eq!(next, Ok("7".to_owned()));
    let empty = cache
        .get_or_load("", || async { Ok::<_, std::io::Error>(String::new()) })
        .await;
    assert!(matches!(empty, Err(Error::Stampede(_))), "{empty:?}");
}
