//! Owner tokens and jitter seeds from the OS CSPRNG.
//!
//! The bytes come from the OS CSPRNG (`getrandom`), read in blocks of
//! [`BLOCK`] bytes per thread and handed out once each: a token and a seed
//! per acquire cost a copy from the block, not a system call (the call,
//! with the kernel's generator set-up it runs, was one of the few system
//! calls a lock's acquire made beyond its requests). No byte is handed out
//! twice. A block read before a `fork` is not used after it: the child
//! holds a copy of the parent's memory, so both would draw the same tokens
//! from it, two owners of one lock under one token. Each draw compares the
//! process id the block was read in with the current one (`getpid`, a
//! system call that does no work) and reads a fresh block when they differ.

use crate::Error;
use lockwright_core::Token;
use std::cell::RefCell;

/// Bytes read from the OS CSPRNG at once, per thread: 21 acquires' token
/// and seed.
const BLOCK: usize = 512;

/// A thread's unused random bytes, and the process that read them.
struct Pool {
    bytes: [u8; BLOCK],
    /// Bytes before this one are used.
    next: usize,
    /// The process id at the read (0 before the first).
    pid: u32,
}

thread_local! {
    static POOL: RefCell<Pool> = const { RefCell::new(Pool::empty()) };
}

impl Pool {
    /// No bytes yet: the first draw reads a block.
    const fn empty() -> Pool {
        Pool {
            bytes: [0; BLOCK],
            next: BLOCK,
            pid: 0,
        }
    }

    /// Fill `out` with bytes never handed out before, in this process.
    fn draw(&mut self, out: &mut [u8], pid: u32) -> Result<(), Error> {
        if self.pid != pid || BLOCK - self.next < out.len() {
            // Mark the block used before reading, so that a failed read
            // leaves nothing stale behind to hand out.
            self.next = BLOCK;
            getrandom::fill(&mut self.bytes).map_err(|e| Error::Random(e.to_string()))?;
            self.next = 0;
            self.pid = pid;
        }
        let end = self.next + out.len();
        let fresh = self.bytes.get_mut(self.next..end).ok_or_else(|| {
            Error::Random(format!("{} random bytes asked for at once", out.len()))
        })?;
        out.copy_from_slice(fresh);
        // Handed out bytes are not left behind in the block.
        fresh.fill(0);
        self.next = end;
        Ok(())
    }
}

/// Fill `out` (at most [`BLOCK`] bytes) from this thread's block of OS
/// randomness.
fn fill(out: &mut [u8]) -> Result<(), Error> {
    let pid = std::process::id();
    POOL.with(|pool| pool.borrow_mut().draw(out, pid))
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
    // empty: the default is unreachable). A plain check, where the lossy
    // conversion walked the text in chunks.
    let text = std::str::from_utf8(&hex).unwrap_or("00000000000000000000000000000000");
    Token(std::sync::Arc::from(text))
}

/// An owner token and a jitter seed from one draw of OS randomness.
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

    #[test]
    fn draws_never_repeat_across_refills() {
        // 2,000 tokens span about 60 blocks: every one differs.
        let mut seen = std::collections::HashSet::new();
        for _ in 0..2_000 {
            assert!(seen.insert(owner_token().unwrap().0));
        }
    }

    #[test]
    fn a_new_process_id_discards_the_block() {
        let mut pool = Pool::empty();
        let mut first = [0u8; 16];
        pool.draw(&mut first, 7).unwrap();
        assert_eq!(pool.next, 16);
        // What a forked child would draw next from the parent's copy.
        let mut copy = [0u8; 16];
        copy.copy_from_slice(&pool.bytes[16..32]);
        let mut child = [0u8; 16];
        pool.draw(&mut child, 8).unwrap();
        assert_eq!(pool.pid, 8);
        assert_eq!(pool.next, 16, "a fresh block was read");
        assert_ne!(child, copy, "the child drew from a fresh block");
        // Same process: the next bytes of the same block.
        let mut parent = [0u8; 16];
        let expected: [u8; 16] = pool.bytes[16..32].try_into().unwrap();
        pool.draw(&mut parent, 8).unwrap();
        assert_eq!(parent, expected);
        assert_eq!(pool.next, 32);
    }

    #[test]
    fn handed_out_bytes_are_cleared_and_a_full_block_refills() {
        let mut pool = Pool::empty();
        let mut out = [0u8; 24];
        pool.draw(&mut out, 1).unwrap();
        assert!(pool.bytes[..24].iter().all(|&b| b == 0));
        pool.next = BLOCK - 10;
        pool.draw(&mut out, 1).unwrap();
        assert_eq!(pool.next, 24, "too few bytes left: a fresh block");
        let mut too_many = [0u8; BLOCK + 1];
        assert!(matches!(pool.draw(&mut too_many, 1), Err(Error::Random(_))));
    }
}
