/* Region decoding of JPEG images with the system's libjpeg-turbo (the classic libjpeg API: it
 * has `jpeg_crop_scanline` and `jpeg_skip_scanlines`, and its SIMD code), for
 * host/src/data/decode.rs. libjpeg reports errors by calling `error_exit`, which must not
 * return: here it longjmps back to the entry point, so no error crosses into Rust as anything
 * but a return code and a message. */
#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>
#include <jerror.h>

#ifndef LIBJPEG_TURBO_VERSION
#error "the jpeglib.h found is not libjpeg-turbo's (jpeg_crop_scanline and jpeg_skip_scanlines are needed)"
#endif

/* Return codes. */
#define TJ_OK 0
#define TJ_ERROR 1
/* A colour space this shim does not convert (CMYK, YCCK): the caller decodes it another way. */
#define TJ_UNSUPPORTED 2

struct tessera_error {
  struct jpeg_error_mgr pub;
  jmp_buf jump;
  char *message;
  int message_len;
};

static void tessera_error_exit(j_common_ptr cinfo) {
  struct tessera_error *err = (struct tessera_error *)cinfo->err;
  if (err->message && err->message_len > 0) {
    char buffer[JMSG_LENGTH_MAX];
    (*cinfo->err->format_message)(cinfo, buffer);
    snprintf(err->message, (size_t)err->message_len, "%s", buffer);
  }
  longjmp(err->jump, 1);
}

/* Warnings are ignored as Pillow ignores them, except a file that ends early (Pillow refuses a
 * truncated image unless LOAD_TRUNCATED_IMAGES is set). */
static void tessera_emit_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    tessera_error_exit(cinfo);
  }
}

static void tessera_output_message(j_common_ptr cinfo) { (void)cinfo; }

static void setup(struct jpeg_decompress_struct *cinfo, struct tessera_error *err, char *message,
                  int message_len) {
  cinfo->err = jpeg_std_error(&err->pub);
  err->pub.error_exit = tessera_error_exit;
  err->pub.emit_message = tessera_emit_message;
  err->pub.output_message = tessera_output_message;
  err->message = message;
  err->message_len = message_len;
  if (message && message_len > 0) message[0] = '\0';
}

static int unsupported(const struct jpeg_decompress_struct *cinfo) {
  return cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK ||
         cinfo->jpeg_color_space == JCS_UNKNOWN;
}

/* The image's width, height and number of components, from its header. */
int tessera_jpeg_info(const unsigned char *data, unsigned long len, int *width, int *height,
                      int *components, char *message, int message_len) {
  struct jpeg_decompress_struct cinfo;
  struct tessera_error err;
  setup(&cinfo, &err, message, message_len);
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return TJ_ERROR;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, len);
  jpeg_read_header(&cinfo, TRUE);
  *width = (int)cinfo.image_width;
  *height = (int)cinfo.image_height;
  *components = cinfo.num_components;
  int code = unsupported(&cinfo) ? TJ_UNSUPPORTED : TJ_OK;
  jpeg_destroy_decompress(&cinfo);
  return code;
}

/* Decodes rows y..y+h and columns x..x+w of the image scaled by 1/denom (denom 1, 2, 4 or 8;
 * the scaled image is ceil(width / denom) x ceil(height / denom), libjpeg's DCT scaling) as RGB
 * into out (w * h * 3 bytes, row after row). `scratch` holds one decoded row of the scaled
 * image (at least its width * 3 bytes). Only the iMCU columns that cover the region, plus one
 * on the right for the upsampling's context, are decoded, and the rows above it are skipped. */
int tessera_jpeg_decode_region(const unsigned char *data, unsigned long len, int denom, int x,
                               int y, int w, int h, unsigned char *out, unsigned char *scratch,
                               unsigned long scratch_len, char *message, int message_len) {
  struct jpeg_decompress_struct cinfo;
  struct tessera_error err;
  setup(&cinfo, &err, message, message_len);
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return TJ_ERROR;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, len);
  jpeg_read_header(&cinfo, TRUE);
  if (unsupported(&cinfo)) {
    jpeg_destroy_decompress(&cinfo);
    return TJ_UNSUPPORTED;
  }
  cinfo.out_color_space = JCS_RGB;
  cinfo.scale_num = 1;
  cinfo.scale_denom = (unsigned int)denom;
  cinfo.dct_method = JDCT_ISLOW;
  jpeg_calc_output_dimensions(&cinfo);
  if (x < 0 || y < 0 || w <= 0 || h <= 0 || (unsigned)(x + w) > cinfo.output_width ||
      (unsigned)(y + h) > cinfo.output_height) {
    snprintf(message, (size_t)message_len, "region %dx%d at (%d, %d) outside the %ux%u image", w,
             h, x, y, cinfo.output_width, cinfo.output_height);
    jpeg_destroy_decompress(&cinfo);
    return TJ_ERROR;
  }
  if (scratch_len < (unsigned long)cinfo.output_width * 3) {
    snprintf(message, (size_t)message_len, "row buffer too small");
    jpeg_destroy_decompress(&cinfo);
    return TJ_ERROR;
  }
  jpeg_start_decompress(&cinfo);
  /* One iMCU column more on the right than needed (when there is one), so that the region's
   * last columns are upsampled with their real right neighbours. */
  JDIMENSION imcu = (JDIMENSION)(cinfo.max_h_samp_factor * cinfo.min_DCT_scaled_size);
  JDIMENSION right = (JDIMENSION)(x + w) + imcu;
  if (right > cinfo.output_width) right = cinfo.output_width;
  JDIMENSION crop_x = (JDIMENSION)x;
  JDIMENSION crop_w = right - crop_x;
  if (crop_x != 0 || crop_w != cinfo.output_width) {
    jpeg_crop_scanline(&cinfo, &crop_x, &crop_w);
  }
  if (y > 0) jpeg_skip_scanlines(&cinfo, (JDIMENSION)y);
  size_t skip = ((size_t)x - crop_x) * 3;
  for (int row = 0; row < h; row++) {
    JSAMPROW rows[1] = {scratch};
    if (jpeg_read_scanlines(&cinfo, rows, 1) != 1) {
      snprintf(message, (size_t)message_len, "no row %d", y + row);
      jpeg_destroy_decompress(&cinfo);
      return TJ_ERROR;
    }
    memcpy(out + (size_t)row * (size_t)w * 3, scratch + skip, (size_t)w * 3);
  }
  jpeg_abort_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return TJ_OK;
}
