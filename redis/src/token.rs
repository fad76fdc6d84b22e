//! Owner tokens and jitter seeds from the OS CSPRNG.
//!
//! The bytes come from the OS CSPRNG (`getrandom`), read [`POOL_BYTES`] at
//! a time into a buffer of the calling thread and handed out once each.
//! Reading the OS for every token cost a system call per acquire, the
//! largest single part of the adapter's extra system time per lock cycle
//! (`docs/benchmarks.md`). Every byte handed out is wiped from the buffer,
//! so the buffer holds only bytes that no token has used.
//!
//! **Fork.** A process that forks and then takes locks in the child
//! without `exec` (Rust code can fork only through `unsafe`) must call
//! [`forget_unused`] in the child first: otherwise the thread that forked
//! hands out the same bytes in parent and child, and the two would share
//! owner tokens.

use crate::Error;
use lockwright_core::Token;
use std::cell::RefCell;

/// How many bytes are read from the OS at a time: 16 acquires' worth (an
/// acquire takes 24: a 16-byte token and an 8-byte jitter seed).
pub const POOL_BYTES: usize = 384;

/// The calling thread's unused CSPRNG bytes: `bytes[next..]`.
struct Pool {
    bytes: [u8; POOL_BYTES],
    next: usize,
}

thread_local! {
    static POOL: RefCell<Pool> = const {
        RefCell::new(Pool { bytes: [0; POOL_BYTES], next: POOL_BYTES })
    };
}

/// Fill `out` with bytes of the OS CSPRNG that nothing else was given.
fn fill(out: &mut [u8]) -> Result<(), Error> {
    let random = |e: getrandom::Error| Error::Random(e.to_string());
    if out.len() > POOL_BYTES {
        return getrandom::fill(out).map_err(random);
    }
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        if POOL_BYTES - pool.next < out.len() {
            getrandom::fill(&mut pool.bytes).map_err(random)?;
            pool.next = 0;
        }
        let from = pool.next;
        let taken = &mut pool.bytes[from..from + out.len()];
        out.copy_from_slice(taken);
        taken.fill(0);
        pool.next += out.len();
        Ok(())
    })
}

/// Wipe the calling thread's unused CSPRNG bytes, so that the next token
/// is read from the OS anew. Call it in a child process after `fork` (see
/// the module docs); nothing else needs it.
pub fn forget_unused() {
    POOL.with(|pool| {
        let mut pool = pool.borrow_mut();
        pool.bytes.fill(0);
        pool.next = POOL_BYTES;
    });
}

/// A fresh owner token: 128 bits from the OS CSPRNG, as 32 lowercase hex digits.
pub fn owner_token() -> Result<Token, Error> {
    let mut bytes = [0u8; 16];
    fill(&mut bytes)?;
    Ok(token_of(&bytes))
}

/// The token's 32 hex digits, written on the stack and copied once into
/// the token's shared string (one allocation per token).
fn token_of(bytes: &[u8; 16]) -> Token {
    let mut hex = [0u8; 32];
    for (pair, &b) in hex.chunks_exact_mut(2).zip(bytes) {
        pair[0] = HEX[usize::from(b >> 4)];
        pair[1] = HEX[usize::from(b & 0xf)];
    }
    // Hex digits are ASCII, so this cannot fail (and a token is never
    // empty: the default is unreachable).
    let text = std::str::from_utf8(&hex).unwrap_or("00000000000000000000000000000000");
    Token(std::sync::Arc::from(text))
}

/// An owner token and a jitter seed, 24 bytes of the CSPRNG.
pub(crate) fn token_and_seed() -> Result<(Token, u64), Error> {
    let mut bytes = [0u8; 24];
    fill(&mut bytes)?;
    let (token, seed) = bytes.split_at(16);
    let token: [u8; 16] = token.try_into().unwrap_or_default();
    let seed: [u8; 8] = seed.try_into().unwrap_or_default();
    Ok((token_of(&token), u64::from_le_bytes(seed)))
}

/// A seed for the machine's retry jitter.
pub(crate) fn seed() -> Result<u64, Error> {
    let mut bytes = [0u8; 8];
    fill(&mut bytes)?;
    Ok(u64::from_le_bytes(bytes))
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn tokens_are_32_hex_digits_and_differ() {
        let a = owner_token().unwrap().0;
        let b = owner_token().unwrap().0;
        assert_eq!(a.len(), 32);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
    }

    #[test]
    fn token_digits_follow_the_bytes() {
        let mut bytes = [0u8; 16];
        bytes[0] = 0xab;
        bytes[15] = 0x0f;
        assert_eq!(&*token_of(&bytes).0, "ab00000000000000000000000000000f");
    }

    /// Across many refills of the pool, on several threads, no token comes
    /// twice: every byte is handed out once.
    #[test]
    fn pooled_tokens_never_repeat() {
        let per_thread = 50 * POOL_BYTES / 16;
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    (0..per_thread)
                        .map(|i| {
                            if i % 3 == 0 {
                                token_and_seed().unwrap().0 .0
                            } else {
                                owner_token().unwrap().0
                            }
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut seen = HashSet::new();
        for t in threads {
            for token in t.join().unwrap() {
                assert!(seen.insert(token), "a token came twice");
            }
        }
        assert_eq!(seen.len(), 4 * per_thread);
    }

    /// The pool hands out each byte once: what is left after a draw is
    /// the draw's successor, and the drawn bytes are wiped.
    #[test]
    fn drawn_bytes_are_wiped_and_forget_unused_empties_the_pool() {
        let mut first = [0u8; 16];
        fill(&mut first).unwrap();
        POOL.with(|pool| {
            let pool = pool.borrow();
            assert!(pool.next >= 16);
            assert!(pool.bytes[..pool.next].iter().all(|&b| b == 0));
        });
        forget_unused();
        POOL.with(|pool| {
            let pool = pool.borrow();
            assert_eq!(pool.next, POOL_BYTES);
            assert!(pool.bytes.iter().all(|&b| b == 0));
        });
        let mut second = [0u8; 16];
        fill(&mut second).unwrap();
        assert_ne!(first, second);
    }
}
