//! A small deterministic generator for the edges' round-trip property
//! tests (no dependency): xorshift64*.

pub(crate) struct Gen(pub u64);

impl Gen {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn flag(&mut self) -> bool {
        self.below(2) == 1
    }
    /// 0–11 lower-case letters.
    pub fn text(&mut self) -> String {
        (0..self.below(12)).map(|_| char::from(b'a' + self.below(26) as u8)).collect()
    }
    /// 1–12 lower-case letters.
    pub fn word(&mut self) -> String {
        let mut w = self.text();
        w.push('w');
        w
    }
    /// `None` or a word.
    pub fn maybe(&mut self) -> Option<String> {
        self.flag().then(|| self.word())
    }
}
