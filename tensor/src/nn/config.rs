//! The one way modules are configured.
//!
//! Every module `X` is built by `X::new(g, name, XConfig)`. `XConfig` is a plain struct with
//! `pub` fields (the sizes, the bias switch, the init and the weight-decay flag of each param,
//! `eps`, …); it implements `Default` when every field has one, and has `XConfig::new(required
//! sizes…)` otherwise. Each field `f` has a chainable setter `with_f(value) -> Self`, so a
//! config reads as a sentence:
//!
//! ```
//! use rocannl_tensor::{Graph, Init, nn::{Linear, LinearConfig}};
//! let g = Graph::new();
//! let cfg = LinearConfig::new(64)
//!     .with_bias(false)
//!     .with_w_init(Init::Normal { mean: 0.0, std: 0.02 });
//! let fc = Linear::new(&g, "fc", cfg);
//! assert!(fc.b.is_none());
//! ```
//!
//! Params are named after the module (`fc.w`, `fc.b`); a config's init and decay fields are
//! named after the param they set (`w_init`, `b_decay`).

/// Chainable setters `with_f(value) -> Self` for the listed fields of a config.
macro_rules! setters {
    ($config:ty { $($setter:ident => $field:ident : $ty:ty),* $(,)? }) => {
        impl $config {
            $(
                #[doc = concat!(
                    "The same config with [`", stringify!($field), "`](Self::",
                    stringify!($field), ") set to `value`."
                )]
                #[must_use]
                pub fn $setter(mut self, value: $ty) -> Self {
                    self.$field = value;
                    self
                }
            )*
        }
    };
}

pub(crate) use setters;
