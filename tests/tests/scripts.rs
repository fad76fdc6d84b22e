//! `Script::sha1()` is the name real Redis gives each catalogue script:
//! `SCRIPT LOAD` of its text answers the same SHA1, so `EVALSHA` built from
//! the core alone finds the script.

use lockwright_core::keyspace::Script;
use lockwright_tests::{raw, redis_or_skip};

#[tokio::test]
async fn every_script_sha1_is_what_script_load_answers() {
    let Some(redis) = redis_or_skip("script sha1") else {
        return;
    };
    let mut conn = redis.conn().await;
    for script in Script::ALL {
        let loaded: String = raw(
            &mut conn,
            redis::cmd("SCRIPT").arg("LOAD").arg(script.lua()),
        )
        .await;
        assert_eq!(script.sha1(), loaded, "{}", script.name());
    }
}
