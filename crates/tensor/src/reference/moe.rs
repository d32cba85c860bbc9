//! Reference MoE routing (docs/model.md, "MLP and MoE", step 1).

use crate::backend::RouteChoice;

/// Softmax over each row of `logits [T, experts]`, top-`k` (ties: lower expert index first),
/// optionally renormalised so the chosen weights sum to 1.
pub fn route_top_k(
    logits: &[f32],
    experts: usize,
    top_k: usize,
    renormalize: bool,
) -> Vec<RouteChoice> {
    let mut out = Vec::with_capacity(logits.len() / experts * top_k);
    for (t, row) in logits.chunks(experts).enumerate() {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
        let exps: Vec<f64> = row.iter().map(|&v| (v as f64 - max).exp()).collect();
        let total: f64 = exps.iter().sum();
        let mut order: Vec<usize> = (0..experts).collect();
        // Stable sort keeps the lower index first among equal probabilities.
        order.sort_by(|&a, &b| exps[b].total_cmp(&exps[a]));
        let chosen = &order[..top_k];
        let chosen_sum: f64 = chosen.iter().map(|&e| exps[e] / total).sum();
        for &e in chosen {
            let p = exps[e] / total;
            let weight = if renormalize { p / chosen_sum } else { p };
            out.push(RouteChoice {
                token: t as u32,
                expert: e as u32,
                weight: weight as f32,
            });
        }
    }
    out
}
