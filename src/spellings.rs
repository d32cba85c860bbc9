//! Several spellings of one setting (`--tp-size`, `--tp`, `--tensor-parallel-size`) folded into one
//! value: the first value given wins, and two different values are an error naming both flags.

use std::fmt::Debug;

/// Two spellings of one setting were given different values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SpellingConflict(pub String);

/// Folds the spellings of one setting into `target` (deltaserve's flag `flag`). Returns the spelling
/// the value came from, for messages about it.
pub fn merge<T: PartialEq + Clone + Debug>(
    target: &mut Option<T>,
    flag: &'static str,
    spellings: &[(&'static str, Option<T>)],
) -> Result<Option<&'static str>, SpellingConflict> {
    let mut source = target.as_ref().map(|_| flag);
    for (name, value) in spellings {
        let Some(value) = value else { continue };
        match (&*target, source) {
            (Some(current), Some(first)) if current != value => {
                return Err(SpellingConflict(format!(
                    "{first} {current:?} and {name} {value:?} set the same thing differently; give one of them"
                )))
            }
            (Some(_), _) => {}
            (None, _) => {
                *target = Some(value.clone());
                source = Some(name);
            }
        }
    }
    Ok(source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_value_wins_and_a_different_one_names_both_flags() {
        let mut tp = None;
        let from = merge(
            &mut tp,
            "--tp-size",
            &[("--tp", None), ("--tensor-parallel-size", Some(2))],
        );
        assert_eq!((tp, from), (Some(2), Ok(Some("--tensor-parallel-size"))));
        let mut tp = Some(2);
        assert_eq!(
            merge(&mut tp, "--tp-size", &[("--tp", Some(2))]),
            Ok(Some("--tp-size"))
        );
        let e = merge(&mut tp, "--tp-size", &[("--tp", Some(4))])
            .unwrap_err()
            .0;
        assert!(e.contains("--tp-size 2") && e.contains("--tp 4"), "{e}");
    }
}
