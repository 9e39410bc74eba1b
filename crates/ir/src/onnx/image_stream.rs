//! What an encoded image stream holds, for [ImageDecoder](https://onnx.ai/onnx/operators/onnx__ImageDecoder.html)
//! (opset 20): its height and width read from the header (shape inference, when the stream is
//! known at plan time) and its pixels (the CPU kernel). Both live here so that planned and
//! decoded sizes come from one reader.
//!
//! The codecs are those the spec lists: JPEG, PNG, BMP, TIFF, WebP and PNM through the `image`
//! crate, JPEG 2000 through `hayro-jpeg2000` when pipecut is built with feature `jpeg2000`. The
//! pixels follow the onnx reference implementation, which decodes with Pillow: colour images as
//! 8-bit RGB (alpha dropped, 16-bit samples scaled), BGR as RGB reversed, Grayscale converted
//! from the decoded RGB with Pillow's ITU-R 601-2 luma.
//!
//! Streams are untrusted input: each side is capped at [`MAX_SIDE`] and the decoded pixels at
//! [`MAX_DECODED_BYTES`] before anything is allocated, and a panic inside a codec is caught and
//! reported as an error.

/// Longest side accepted, in pixels: JPEG's own limit (its header stores sides in 16 bits), far
/// above what a model consumes, and small enough that a forged PNG or TIFF header claiming
/// 2^31 × 2^31 pixels is refused before any allocation.
pub const MAX_SIDE: u32 = 65_535;

/// Most bytes a decode may allocate for its pixels: a 16,384 × 16,384 RGBA image (1 GiB). The
/// runtime then holds each uint8 pixel as an int64 (the runtime widens narrow integers),
/// so the decoded tensor is 8× this; capping here keeps a hostile stream from asking for more.
pub const MAX_DECODED_BYTES: u64 = 1 << 30;

/// ImageDecoder's `pixel_format` attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PixelFormat {
    /// Red, green, blue (the default).
    Rgb,
    /// Blue, green, red (OpenCV's order).
    Bgr,
    /// One luma channel.
    Grayscale,
}

impl PixelFormat {
    /// Parses the attribute's value (`None`: the default, RGB).
    pub fn parse(value: Option<&str>) -> Result<Self, String> {
        match value.unwrap_or("RGB") {
            "RGB" => Ok(PixelFormat::Rgb),
            "BGR" => Ok(PixelFormat::Bgr),
            "Grayscale" => Ok(PixelFormat::Grayscale),
            other => Err(format!(
                "pixel_format '{other}' is not RGB, BGR or Grayscale"
            )),
        }
    }

    /// Channels of the output's last axis.
    pub fn channels(self) -> usize {
        match self {
            PixelFormat::Rgb | PixelFormat::Bgr => 3,
            PixelFormat::Grayscale => 1,
        }
    }
}

/// A decoded image: `height × width × channels` bytes, row-major, channels last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedImage {
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
    /// Channels per pixel (3 or 1).
    pub channels: usize,
    /// `height × width × channels` bytes.
    pub pixels: Vec<u8>,
}

#[cfg(feature = "image")]
mod codec;
#[cfg(feature = "image")]
pub use codec::{decode, dimensions};

/// Without feature `image` (the planner alone) no codec is compiled: a known stream's height
/// and width stay symbols that `--dim` binds, as for a stream known only at run time.
#[cfg(not(feature = "image"))]
pub fn dimensions(_encoded: &[u8]) -> Result<(u32, u32), String> {
    Err("this build of pipecut has no image codecs (feature `image`)".into())
}
