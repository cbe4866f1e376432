//! The Pillow 11.3 operations Composer's augmentation primitives call, on 8-bit images, with
//! Pillow's integer and floating-point arithmetic (`libImaging`'s `Geometry.c`, `Blend.c`,
//! `Filter.c`, `Convert.c` and `ImageOps`/`ImageEnhance`/`ImageStat` in Python), so that the
//! bytes match Pillow's.

/// An 8-bit image, channel-major (C×H×W): 3 channels are Pillow's mode "RGB", 1 is mode "L".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// Channels: 1 or 3.
    pub channels: usize,
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
    /// C×H×W values.
    pub data: Vec<u8>,
}

impl Image {
    fn plane(&self, c: usize) -> &[u8] {
        let n = self.height * self.width;
        &self.data[c * n..(c + 1) * n]
    }

    fn planes_mut(&mut self) -> std::slice::ChunksExactMut<'_, u8> {
        let n = self.height * self.width;
        self.data.chunks_exact_mut(n.max(1))
    }

    /// Applies a 256-entry lookup table to every channel (`Image.point`).
    fn point(&mut self, lut: impl Fn(usize, u8) -> u8) {
        for (c, plane) in self.planes_mut().enumerate() {
            for v in plane {
                *v = lut(c, *v);
            }
        }
    }

    /// The 256-bin histogram of channel `c`.
    fn histogram(&self, c: usize) -> [u64; 256] {
        let mut h = [0u64; 256];
        for &v in self.plane(c) {
            h[v as usize] += 1;
        }
        h
    }

    /// Pillow's `convert("L")`: ITU-R 601-2 luma in fixed point, `(19595 R + 38470 G + 7471 B
    /// + 0x8000) >> 16`; a grey image is its own luma.
    fn luma(&self) -> Vec<u8> {
        if self.channels == 1 {
            return self.data.clone();
        }
        let (r, g, b) = (self.plane(0), self.plane(1), self.plane(2));
        (0..r.len())
            .map(|i| {
                let l = r[i] as u32 * 19595 + g[i] as u32 * 38470 + b[i] as u32 * 7471 + 0x8000;
                (l >> 16) as u8
            })
            .collect()
    }
}

/// `ImageOps.autocontrast(img, cutoff=0)`: per channel, the lowest and highest values present
/// are stretched to 0 and 255 with the lookup table `int(i·scale + offset)` clamped to
/// `[0, 255]`, `scale = 255 / (hi − lo)`, `offset = −lo·scale`; a channel with one value is
/// kept.
pub fn autocontrast(img: &mut Image) {
    let luts: Vec<[u8; 256]> = (0..img.channels)
        .map(|c| {
            let h = img.histogram(c);
            let lo = h.iter().position(|&n| n > 0);
            let hi = h.iter().rposition(|&n| n > 0);
            let mut lut = [0u8; 256];
            for (i, v) in lut.iter_mut().enumerate() {
                *v = match (lo, hi) {
                    (Some(lo), Some(hi)) if hi > lo => {
                        let scale = 255.0 / (hi - lo) as f64;
                        let offset = -(lo as f64) * scale;
                        // Python's int() truncates towards zero, then the clamp.
                        ((i as f64 * scale + offset) as i64).clamp(0, 255) as u8
                    }
                    _ => i as u8,
                };
            }
            lut
        })
        .collect();
    img.point(|c, v| luts[c][v as usize]);
}

/// `ImageOps.equalize(img)`: per channel, with the histogram's non-zero bins `histo`,
/// `step = (Σ histo − last(histo)) // 255`; the table maps `i` to `n // step` where `n` starts
/// at `step // 2` and adds the count of each bin below `i`. One non-zero bin or `step = 0`
/// keeps the channel.
pub fn equalize(img: &mut Image) {
    let luts: Vec<[u8; 256]> = (0..img.channels)
        .map(|c| {
            let h = img.histogram(c);
            let nonzero: Vec<u64> = h.iter().copied().filter(|&n| n > 0).collect();
            let mut lut = [0u8; 256];
            let step = match nonzero.last() {
                Some(&last) if nonzero.len() > 1 => (nonzero.iter().sum::<u64>() - last) / 255,
                _ => 0,
            };
            let mut n = step / 2;
            for (i, v) in lut.iter_mut().enumerate() {
                // n // step can reach 256 from the last value on; `Image.point` clips the
                // table's entries to a byte. `step = 0` keeps the channel.
                *v = match n.checked_div(step) {
                    Some(q) => q.min(255) as u8,
                    None => i as u8,
                };
                n += h[i];
            }
            lut
        })
        .collect();
    img.point(|c, v| luts[c][v as usize]);
}

/// `ImageOps.posterize(img, bits)`: keeps the top `bits` bits of every value.
pub fn posterize(img: &mut Image, bits: u32) {
    let mask = !((1u32 << (8 - bits.min(8))) - 1) as u8;
    img.point(|_, v| v & mask);
}

/// `ImageOps.solarize(img, threshold)`: values at or above `threshold` become `255 − v`.
pub fn solarize(img: &mut Image, threshold: i64) {
    img.point(|_, v| if (v as i64) < threshold { v } else { 255 - v });
}

/// Python's `round(x, 15)`: correctly rounded to 15 decimals, as `Image.rotate` rounds its
/// matrix.
fn round15(x: f64) -> f64 {
    format!("{x:.15}").parse().unwrap_or(x)
}

/// The affine data `Image.rotate(degrees)` (no expand, centre of the image, no translation)
/// passes to `Image.transform`: the inverse rotation about `(w/2, h/2)`, its cosine and sine
/// rounded to 15 decimals as Pillow does.
pub fn rotate_matrix(degrees: f64, width: usize, height: usize) -> [f64; 6] {
    let (cx, cy) = (width as f64 / 2.0, height as f64 / 2.0);
    let angle = -(degrees.rem_euclid(360.0)).to_radians();
    let (cos, sin) = (round15(angle.cos()), round15(angle.sin()));
    let mut m = [cos, sin, 0.0, -sin, cos, 0.0];
    // matrix[2], matrix[5] = transform(-center, matrix), then += center.
    let (x, y) = (-cx, -cy);
    m[2] = m[0] * x + m[1] * y + m[2] + cx;
    m[5] = m[3] * x + m[4] * y + m[5] + cy;
    m
}

/// `Image.rotate(degrees, BILINEAR)` (counter-clockwise, same size, black fill): a copy for 0°
/// (mod 360), otherwise [`affine`] with [`rotate_matrix`]. Pillow turns 90°, 180° and 270° into
/// exact transposes; RandAugment's angles never pass 30°, so those are not special-cased here
/// and [`rotate`] refuses them rather than differ.
pub fn rotate(img: &mut Image, degrees: f64) -> Result<(), String> {
    let a = degrees.rem_euclid(360.0);
    if a == 0.0 {
        return Ok(());
    }
    if a == 90.0 || a == 180.0 || a == 270.0 {
        return Err(format!(
            "rotating by {degrees}° is a transpose in Pillow, which this emulation does not do"
        ));
    }
    let m = rotate_matrix(degrees, img.width, img.height);
    affine(img, &m);
    Ok(())
}

/// `Image.transform(size, AFFINE, data, BILINEAR)` to the same size with black fill: output
/// pixel `(x, y)` samples the input at `(a·(x+½) + b·(y+½) + c, d·(x+½) + e·(y+½) + f)`; a point
/// outside `[0, W) × [0, H)` is black; inside, the bilinear mix of the four pixels around it
/// (edges clamped; below the last row, the row itself), truncated to a byte as libImaging's
/// `bilinear_filter` does.
pub fn affine(img: &mut Image, m: &[f64; 6]) {
    let (w, h) = (img.width, img.height);
    let mut out = vec![0u8; img.data.len()];
    let xclip = |x: i64| x.clamp(0, w as i64 - 1) as usize;
    let yclip = |y: i64| y.clamp(0, h as i64 - 1) as usize;
    for y in 0..h {
        for x in 0..w {
            let (xo, yo) = (x as f64 + 0.5, y as f64 + 0.5);
            let xin = m[0] * xo + m[1] * yo + m[2];
            let yin = m[3] * xo + m[4] * yo + m[5];
            if xin < 0.0 || xin >= w as f64 || yin < 0.0 || yin >= h as f64 {
                continue;
            }
            let (xs, ys) = (xin - 0.5, yin - 0.5);
            let (xf, yf) = (xs.floor() as i64, ys.floor() as i64);
            let (dx, dy) = (xs - xf as f64, ys - yf as f64);
            let (x0, x1) = (xclip(xf), xclip(xf + 1));
            let row0 = yclip(yf);
            let next_row = (yf + 1 >= 0 && yf + 1 < h as i64).then_some((yf + 1) as usize);
            for c in 0..img.channels {
                let plane = img.plane(c);
                let at = |row: usize, col: usize| plane[row * w + col] as f64;
                let lerp = |a: f64, b: f64, d: f64| a + (b - a) * d;
                let v1 = lerp(at(row0, x0), at(row0, x1), dx);
                let v2 = match next_row {
                    Some(r) => lerp(at(r, x0), at(r, x1), dx),
                    None => v1,
                };
                out[(c * h + y) * w + x] = lerp(v1, v2, dy) as u8;
            }
        }
    }
    img.data = out;
}

/// `Image.blend(degenerate, img, factor)`: `in1 + factor·(in2 − in1)` in single precision
/// (Pillow passes the factor as a C `float`), truncated to a byte; outside `[0, 1]` clamped to
/// `[0, 255]` first.
fn blend(degenerate: &[u8], img: &mut [u8], factor: f64) {
    let alpha = factor as f32;
    let interpolate = (0.0..=1.0).contains(&alpha);
    for (out, &d) in img.iter_mut().zip(degenerate) {
        let temp = d as i32 as f32 + alpha * ((*out as i32 - d as i32) as f32);
        *out = if interpolate || (temp > 0.0 && temp < 255.0) {
            temp as u8
        } else if temp <= 0.0 {
            0
        } else {
            255
        };
    }
}

/// `ImageEnhance.Color(img).enhance(factor)`: blends with the image's greyscale (its luma in
/// every channel). A grey image is its own greyscale: unchanged.
pub fn color(img: &mut Image, factor: f64) {
    let luma = img.luma();
    let degenerate: Vec<u8> = (0..img.channels)
        .flat_map(|_| luma.iter().copied())
        .collect();
    blend(&degenerate, &mut img.data, factor);
}

/// `ImageEnhance.Contrast(img).enhance(factor)`: blends with a flat image of the mean luma,
/// `int(mean + 0.5)` (from the luma histogram, as `ImageStat`).
pub fn contrast(img: &mut Image, factor: f64) {
    let luma = img.luma();
    let sum: f64 = luma.iter().map(|&v| v as f64).sum();
    let mean = (sum / luma.len().max(1) as f64 + 0.5) as u8;
    let degenerate = vec![mean; img.data.len()];
    blend(&degenerate, &mut img.data, factor);
}

/// `ImageEnhance.Brightness(img).enhance(factor)`: blends with black.
pub fn brightness(img: &mut Image, factor: f64) {
    let degenerate = vec![0u8; img.data.len()];
    blend(&degenerate, &mut img.data, factor);
}

/// `img.filter(ImageFilter.SMOOTH)`: the 3×3 kernel `[1 1 1; 1 5 1; 1 1 1] / 13` in single
/// precision with `+0.5` for rounding, summed as libImaging's `ImagingFilter3x3` does (row
/// below, row, row above; left to right), clipped to a byte; the border pixels are copied.
fn smooth(img: &Image) -> Image {
    let mut out = img.clone();
    let (w, h) = (img.width, img.height);
    if w < 3 || h < 3 {
        return out;
    }
    let k = [1.0f32 / 13.0, 5.0f32 / 13.0];
    for c in 0..img.channels {
        let plane = img.plane(c);
        let at = |y: usize, x: usize| plane[y * w + x] as f32;
        for y in 1..h - 1 {
            for x in 1..w - 1 {
                let mut ss = 0.5f32;
                for (row, centre) in [(y + 1, false), (y, true), (y - 1, false)] {
                    let mid = if centre { k[1] } else { k[0] };
                    ss += at(row, x - 1) * k[0] + at(row, x) * mid + at(row, x + 1) * k[0];
                }
                out.data[(c * h + y) * w + x] = if ss <= 0.0 {
                    0
                } else if ss >= 255.0 {
                    255
                } else {
                    ss as u8
                };
            }
        }
    }
    out
}

/// `ImageEnhance.Sharpness(img).enhance(factor)`: blends with the [`smooth`]ed image.
pub fn sharpness(img: &mut Image, factor: f64) {
    let degenerate = smooth(img);
    blend(&degenerate.data, &mut img.data, factor);
}
