//! One way to read a table into a domain type: [`section!`] names each key once, with how it
//! is read, and derives both the key list (unknown keys are rejected against it, with a
//! did-you-mean) and the reads. The value a section starts from holds the defaults, so each
//! default lives in the domain type (its `Default` or constructor).

use super::error::ConfigError;
use super::reader::Tbl;

/// A table of `trainer.toml` read into `Self`.
pub(crate) trait Section: Sized {
    /// Every key of the table, in the order error messages list them.
    const KEYS: &'static [&'static str];

    /// Reads each present key that has a reader into `self` (the keys listed without one are
    /// read by hand by the caller).
    fn read_keys(self, t: &Tbl<'_>) -> Result<Self, ConfigError>;
}

/// `section!(Type { key: reader(args), other_key, ... })` implements [`Section`] for `Type`:
/// `key` is read with `Tbl::reader("key", args)` into the field `key` (`Option` fields take
/// the value as `Some`); a key without a reader belongs to the table but is read by hand.
macro_rules! section {
    ($ty:ty { $($key:ident $(: $reader:ident $(::<$gen:ty>)? ($($arg:expr),* $(,)?))?),* $(,)? }) => {
        impl $crate::config::section::Section for $ty {
            const KEYS: &'static [&'static str] = &[$(stringify!($key)),*];

            fn read_keys(
                #[allow(unused_mut)] mut self,
                #[allow(unused_variables)] t: &$crate::config::reader::Tbl<'_>,
            ) -> Result<Self, $crate::config::ConfigError> {
                $($(
                    if let Some(v) = t.$reader $(::<$gen>)? (stringify!($key) $(, $arg)*)? {
                        self.$key = v.into();
                    }
                )?)*
                Ok(self)
            }
        }
    };
}
pub(crate) use section;

impl<'a> Tbl<'a> {
    /// The sub-table `key` read as section `T`, starting from `start`; `None` when absent.
    pub fn section<T: Section>(
        &self,
        key: &str,
        start: impl FnOnce() -> T,
    ) -> Result<Option<T>, ConfigError> {
        match self.sub(key, Some(T::KEYS))? {
            Some(t) => start().read_keys(&t).map(Some),
            None => Ok(None),
        }
    }
}
