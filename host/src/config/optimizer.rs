//! `[optimizer]`, tagged by `name`, with `implementation` and `[[optimizer.groups]]`: read into
//! [`optim::OptimizerConfig`](OptimizerConfig).

use super::error::{ConfigError, ErrorKind};
use super::reader::{Bounds, Tbl};
use super::section::{section, Section};
use super::tree::Val;
use crate::optim::{
    Adam, AdamW, GroupSpec, Implementation, Lion, OptimizerConfig, ParamKind, Rule, Sgd,
};

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

section!(Adam {
    lr: float(Bounds::POSITIVE),
    weight_decay: float(Bounds::NON_NEGATIVE),
    betas,
    eps: float(Bounds::POSITIVE),
});

section!(Lion {
    lr: float(Bounds::POSITIVE),
    weight_decay: float(Bounds::NON_NEGATIVE),
    betas,
});

section!(GroupSpec {
    name: string(),
    params,
    kinds,
    ndim: uint(0),
    lr_multiplier: float(Bounds::NON_NEGATIVE),
    weight_decay: float(Bounds::NON_NEGATIVE),
});

#[derive(Clone, Copy)]
enum Name {
    Sgd,
    AdamW,
    Adam,
    Lion,
}

/// Each optimizer's `name` and keys.
const OPTIMIZERS: [(&str, Name, &[&str]); 4] = [
    ("sgd", Name::Sgd, Sgd::KEYS),
    ("adamw", Name::AdamW, AdamW::KEYS),
    ("adam", Name::Adam, Adam::KEYS),
    ("lion", Name::Lion, Lion::KEYS),
];

/// Keys of `[optimizer]` that every optimizer takes.
const COMMON: [&str; 3] = ["name", "implementation", "groups"];

pub(super) fn read(top: &Tbl<'_>) -> Result<OptimizerConfig, ConfigError> {
    let mut keys = COMMON.to_vec();
    for key in OPTIMIZERS.iter().flat_map(|(_, _, k)| k.iter()) {
        if !keys.contains(key) {
            keys.push(key);
        }
    }
    let Some(o) = top.sub("optimizer", Some(&keys))? else {
        return Ok(OptimizerConfig::default());
    };
    let names = OPTIMIZERS.map(|(label, name, _)| (label, name));
    let name = o.choice("name", "optimizer", &names)?.unwrap_or(Name::Sgd);
    let (label, own) = OPTIMIZERS
        .iter()
        .find(|(_, n, _)| std::mem::discriminant(n) == std::mem::discriminant(&name))
        .map(|(l, _, k)| (*l, *k))
        .unwrap_or(("sgd", Sgd::KEYS));
    for (other_label, _, other) in OPTIMIZERS.iter().filter(|(l, _, _)| *l != label) {
        for key in other.iter().filter(|k| !own.contains(k)) {
            o.reject(
                key,
                &format!(
                    "`{key}` is a setting of optimizer {other_label:?}, not {label:?}; valid keys for {label:?}: name, {}, implementation, groups",
                    own.join(", ")
                ),
            )?;
        }
    }
    let rule = match name {
        Name::Sgd => {
            let c = Sgd::default().read_keys(&o)?;
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
        Name::AdamW => {
            let mut c = AdamW::default().read_keys(&o)?;
            c.betas = betas(&o)?.unwrap_or(c.betas);
            Rule::AdamW(c)
        }
        Name::Adam => {
            let mut c = Adam::default().read_keys(&o)?;
            c.betas = betas(&o)?.unwrap_or(c.betas);
            Rule::Adam(c)
        }
        Name::Lion => {
            let mut c = Lion::default().read_keys(&o)?;
            c.betas = betas(&o)?.unwrap_or(c.betas);
            Rule::Lion(c)
        }
    };
    let implementation = o
        .choice(
            "implementation",
            "optimizer implementation",
            &Implementation::CHOICES,
        )?
        .unwrap_or_default();
    let groups = groups(&o)?;
    Ok(OptimizerConfig {
        rule,
        groups,
        implementation,
    })
}

/// `betas = [beta1, beta2]`, each in [0, 1).
fn betas(o: &Tbl<'_>) -> Result<Option<(f64, f64)>, ConfigError> {
    let Some(b) = o.float_list("betas", Bounds::UNIT_OPEN)? else {
        return Ok(None);
    };
    match b.as_slice() {
        [b1, b2]
            if o.entry("betas")
                .is_some_and(|e| matches!(e.node.val, Val::Array(_))) =>
        {
            Ok(Some((*b1, *b2)))
        }
        _ => Err(o.err(
            "betas",
            ErrorKind::InvalidValue,
            format!(
                "must be a list of 2 numbers [beta1, beta2], got {} value(s)",
                b.len()
            ),
        )),
    }
}

/// `[[optimizer.groups]]`: each needs a selector; patterns must be valid globs; names unique.
fn groups(o: &Tbl<'_>) -> Result<Vec<GroupSpec>, ConfigError> {
    let Some(entry) = o.entry("groups") else {
        return Ok(Vec::new());
    };
    let Val::Array(items) = &entry.node.val else {
        return Err(o.err(
            "groups",
            ErrorKind::WrongType,
            format!(
                "expected [[optimizer.groups]] tables, got {}",
                entry.node.val.describe()
            ),
        ));
    };
    let mut out: Vec<GroupSpec> = Vec::with_capacity(items.len());
    for (i, node) in items.iter().enumerate() {
        let path = o.key(&format!("groups.{i}"));
        let g = Tbl::open(o.file, o.base, &path, node, Some(GroupSpec::KEYS))?;
        let mut spec = GroupSpec::named(format!("groups[{i}]")).read_keys(&g)?;
        if let Some(patterns) = g.string_list("params")? {
            for (k, p) in patterns.iter().enumerate() {
                if let Err(e) = glob::Pattern::new(p) {
                    return Err(g.err(
                        &format!("params.{k}"),
                        ErrorKind::InvalidValue,
                        format!("{p:?} is not a valid pattern: {e}"),
                    ));
                }
            }
            spec.params = patterns;
        }
        if let Some(kinds) = g.string_list("kinds")? {
            let names: Vec<&str> = ParamKind::CHOICES.iter().map(|(n, _)| *n).collect();
            for (k, name) in kinds.iter().enumerate() {
                match ParamKind::CHOICES.iter().find(|(n, _)| n == name) {
                    Some((_, kind)) => spec.kinds.push(*kind),
                    None => {
                        return Err(g.err(
                            &format!("kinds.{k}"),
                            ErrorKind::InvalidValue,
                            format!(
                                "unknown parameter kind {name:?}; expected {}",
                                super::reader::quote_list(&names)
                            ),
                        ))
                    }
                }
            }
        }
        if !spec.selects() {
            return Err(g.missing(
                "params",
                "a selector: `params` (name patterns), `kinds` (\"bias\", \"norm\", \"embedding\") or `ndim`",
            ));
        }
        if out.iter().any(|other| other.name == spec.name) {
            return Err(g.err(
                "name",
                ErrorKind::InvalidValue,
                format!("another group is named {:?}", spec.name),
            ));
        }
        if spec.name == "default" {
            return Err(g.err(
                "name",
                ErrorKind::InvalidValue,
                "\"default\" names the group of the parameters no group selects",
            ));
        }
        out.push(spec);
    }
    Ok(out)
}
