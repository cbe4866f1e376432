//! `[optimizer]`, tagged by `name`: read into [`optim::Rule`](Rule).

use super::error::{ConfigError, ErrorKind};
use super::reader::{Bounds, Tbl};
use super::section::{section, Section};
use super::tree::Val;
use crate::optim::{AdamW, Rule, Sgd};

section!(Sgd {
    lr: float(Bounds::POSITIVE),
    weight_decay: float(Bounds::NON_NEGATIVE),
    momentum: float(Bounds::UNIT_OPEN),
    nesterov: bool(),
    dampening: float(Bounds::UNIT),
    decoupled_weight_decay: bool(),
});

section!(AdamW {
    lr: float(Bounds::POSITIVE),
    weight_decay: float(Bounds::NON_NEGATIVE),
    betas,
    eps: float(Bounds::POSITIVE),
});

#[derive(Clone, Copy)]
enum Name {
    Sgd,
    AdamW,
}

/// Each optimizer's `name` and keys.
const OPTIMIZERS: [(&str, Name, &[&str]); 2] = [
    ("sgd", Name::Sgd, Sgd::KEYS),
    ("adamw", Name::AdamW, AdamW::KEYS),
];

pub(super) fn read(top: &Tbl<'_>) -> Result<Rule, ConfigError> {
    let mut keys = vec!["name"];
    for key in OPTIMIZERS.iter().flat_map(|(_, _, k)| k.iter()) {
        if !keys.contains(key) {
            keys.push(key);
        }
    }
    let Some(o) = top.sub("optimizer", Some(&keys))? else {
        return Ok(Rule::default());
    };
    let names = OPTIMIZERS.map(|(label, name, _)| (label, name));
    let start = match o.choice("name", "optimizer", &names)? {
        Some(Name::Sgd) => Rule::Sgd(Sgd::default()),
        Some(Name::AdamW) => Rule::AdamW(AdamW::default()),
        None => Rule::default(),
    };
    let (label, own) = match start {
        Rule::Sgd(_) => ("sgd", Sgd::KEYS),
        Rule::AdamW(_) => ("adamw", AdamW::KEYS),
    };
    for (other_label, _, other) in OPTIMIZERS.iter().filter(|(l, _, _)| *l != label) {
        for key in other.iter().filter(|k| !own.contains(k)) {
            o.reject(
                key,
                &format!(
                    "`{key}` is a setting of optimizer {other_label:?}, not {label:?}; valid keys for {label:?}: name, {}",
                    own.join(", ")
                ),
            )?;
        }
    }
    Ok(match start {
        Rule::Sgd(start) => {
            let c = start.read_keys(&o)?;
            if c.nesterov && (c.momentum <= 0.0 || c.dampening != 0.0) {
                return Err(o.err(
                    "nesterov",
                    ErrorKind::InvalidValue,
                    format!(
                        "nesterov = true needs momentum > 0 and dampening = 0, got momentum {} and dampening {}",
                        c.momentum, c.dampening
                    ),
                ));
            }
            Rule::Sgd(c)
        }
        Rule::AdamW(start) => {
            let mut c = start.read_keys(&o)?;
            if let Some(b) = o.float_list("betas", Bounds::UNIT_OPEN)? {
                c.betas = match b.as_slice() {
                    [b1, b2]
                        if o.entry("betas")
                            .is_some_and(|e| matches!(e.node.val, Val::Array(_))) =>
                    {
                        (*b1, *b2)
                    }
                    _ => {
                        return Err(o.err(
                            "betas",
                            ErrorKind::InvalidValue,
                            format!(
                                "must be a list of 2 numbers [beta1, beta2], got {} value(s)",
                                b.len()
                            ),
                        ))
                    }
                };
            }
            Rule::AdamW(c)
        }
    })
}
