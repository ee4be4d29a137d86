//! The one conversion between the domain language and its wire enum.

use warren_core::Language;

use crate::agent::Language as Wire;

impl From<Language> for Wire {
    fn from(l: Language) -> Wire {
        match l {
            Language::Python => Wire::Python,
            Language::Node => Wire::Node,
            Language::Bash => Wire::Bash,
        }
    }
}

impl TryFrom<Wire> for Language {
    /// `LANGUAGE_UNSPECIFIED` has no domain value.
    type Error = ();

    fn try_from(w: Wire) -> Result<Language, ()> {
        match w {
            Wire::Python => Ok(Language::Python),
            Wire::Node => Ok(Language::Node),
            Wire::Bash => Ok(Language::Bash),
            Wire::Unspecified => Err(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_language_round_trips() {
        for l in Language::ALL {
            assert_eq!(Language::try_from(Wire::from(l)), Ok(l));
        }
        assert!(Language::try_from(Wire::Unspecified).is_err());
    }
}
