//! Concave hulls of hit curves: the upper concave hull of a curve (its points no chord
//! passes above) and the concave majorant it gives at every size. Allocators that are
//! exact for concave curves (greedy over hull segments in `policy::hull_greedy`, the
//! fast cluster solver of ELICA's Eq. 4 in `cluster::fast`) run on these when a measured
//! curve is not concave (cf. Talus).

/// Upper concave hull of `y[from..]` as indices into `y` (first is `from`, last is the end).
pub fn upper_hull(y: &[f64], from: usize) -> Vec<usize> {
    let mut h: Vec<usize> = Vec::new();
    for x in from..y.len() {
        while h.len() >= 2 {
            let (a, b) = (h[h.len() - 2], h[h.len() - 1]);
            // Drop b if it lies on or below the chord a → x.
            let cross = (y[b] - y[a]) * (x - a) as f64 - (y[x] - y[a]) * (b - a) as f64;
            if cross <= 1e-12 {
                h.pop();
            } else {
                break;
            }
        }
        h.push(x);
    }
    h
}

/// The least concave curve on or above `y` at every index: its hull, interpolated
/// linearly between hull points (a size between two hull points is valued on their chord).
pub fn concave_majorant(y: &[f64]) -> Vec<f64> {
    let h = upper_hull(y, 0);
    let mut out = y.to_vec();
    for seg in h.windows(2) {
        let (a, b) = (seg[0], seg[1]);
        for (x, o) in out.iter_mut().enumerate().take(b).skip(a + 1) {
            *o = y[a] + (y[b] - y[a]) * (x - a) as f64 / (b - a) as f64;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hull_skips_points_below_chords() {
        // 0, 1, 1, 4: the hull of a convex-then-flat step jumps from 0 to 3.
        assert_eq!(upper_hull(&[0.0, 1.0, 1.0, 4.0], 0), [0, 3]);
        assert_eq!(upper_hull(&[0.0, 3.0, 5.0, 6.0], 0), [0, 1, 2, 3]);
        assert_eq!(upper_hull(&[0.0, 3.0, 5.0, 6.0], 2), [2, 3]);
    }

    #[test]
    fn the_majorant_lies_on_chords_over_dips_and_keeps_concave_curves() {
        assert_eq!(concave_majorant(&[0.0, 1.0, 1.0, 4.0]), [0.0, 4.0 / 3.0, 8.0 / 3.0, 4.0]);
        assert_eq!(concave_majorant(&[0.0, 3.0, 5.0, 6.0]), [0.0, 3.0, 5.0, 6.0]);
        assert_eq!(concave_majorant(&[]), Vec::<f64>::new());
    }
}
