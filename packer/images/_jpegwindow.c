/* packer.images._jpegwindow: decode one rectangle of a JPEG with the system's libjpeg-turbo, skipping
 * what the library lets a decoder skip outside it (the readers' ``crop=``). Rows above the
 * window: jpeg_skip_scanlines (entropy-decoded, but no inverse DCT, upsampling or colour
 * conversion); columns outside it: jpeg_crop_scanline (the same, per iMCU column); rows below it:
 * not decoded at all (the decode ends after the window's last row). Builds with libjpeg-turbo >= 1.5;
 * packer uses it only when built against the version its pixels were checked with or newer
 * (packer.images.imageproc.WINDOW_DECODER_MINIMUM) and only for Huffman-coded frames (SOF0-SOF2); where
 * it is not used, packer decodes whole images and crops them (the same pixels).
 *
 * The columns are widened by one iMCU on each side before cropping, so that the chroma upsampler
 * sees the neighbours a full decode sees; tests/datasets/test_crop.py checks that the pixels equal a full
 * decode's (simplejpeg's and OpenCV's, which use libjpeg-turbo with the same defaults).
 * With a scale of 2, 4 or 8 the image is decoded at 1/scale of its size (libjpeg-turbo's reduced-size
 * inverse DCT, scale_num / scale_denom = 1 / scale) and the window is given in the scaled image's
 * pixels: the pixels are those of a whole scaled decode (TurboJPEG's, OpenCV's IMREAD_REDUCED_*) cut
 * to the window, as tests/datasets/test_reduced.py checks.
 * Strict: a libjpeg warning (damaged data) or error ends the decode and the call returns None.
 * Colour spaces other than gray, YCbCr and RGB, precisions other than 8 bits and arithmetic-coded
 * JPEGs (whose damage libjpeg does not warn about) return None. The module's ``libjpeg_turbo``
 * attribute is the libjpeg-turbo version it was built against ("2.1.5"), for packer to decide
 * whether to use it.
 *
 * resize_area: the readers' shrinking resize (RandomResizedCrop's INTER_AREA), the same
 * arithmetic as OpenCV's INTER_AREA at non-integer ratios (each output pixel the float average of
 * its footprint, weights and sums in single precision in the same order, rounded to nearest even),
 * so the same bytes: tests/images/test_resize.py compares them with cv2.resize over many sizes.
 * It is faster where OpenCV recomputes a source row's horizontal pass for each output row it
 * feeds and sums through memory: here each source row is filtered once, its three channels as one
 * SSE2 vector, and the vertical sums are vector loops. Built with -ffp-contract=off: a fused
 * multiply-add would change the last bit of some sums, and with it some pixels.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <jpeglib.h>

#if !defined(JCS_EXTENSIONS)
#error "libjpeg-turbo (JCS_EXT_RGB) is needed; packer falls back to full decodes without this module"
#endif

#define ROWS_PER_CALL 16

#define TEXT(x) #x
#define VERSION_TEXT(x) TEXT(x)
#if defined(LIBJPEG_TURBO_VERSION)
#define BUILT_AGAINST VERSION_TEXT(LIBJPEG_TURBO_VERSION)
#else
#define BUILT_AGAINST ""
#endif

struct guard {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
};

static void stop_on_error(j_common_ptr cinfo) { longjmp(((struct guard *)cinfo->err)->jump, 1); }

static void stop_on_warning(j_common_ptr cinfo, int level)
{
    if (level < 0)
        longjmp(((struct guard *)cinfo->err)->jump, 1);
}

/* Decode rows top .. top + height of the columns around left .. left + width into out, a buffer
 * of height rows of out_cols RGB pixels each: row r of the decoded region starts at
 * out + r * out_cols * 3, its column 0 being image column left - *shift. Returns 1, 0 where the
 * payload must be decoded whole instead, and sets *bad_window for a window outside the image or
 * a region wider than out_cols (the caller makes out_cols >= width + 3 iMCUs, or the image's). */
static int decode(const unsigned char *data, size_t size, unsigned char *out, JDIMENSION out_cols,
                  JDIMENSION top, JDIMENSION left, JDIMENSION height, JDIMENSION width,
                  unsigned int scale, JDIMENSION *shift, int *bad_window)
{
    struct jpeg_decompress_struct cinfo;
    struct guard err;
    volatile int ok = 0;

    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = stop_on_error;
    err.pub.emit_message = stop_on_warning;
    jpeg_create_decompress(&cinfo);
    if (setjmp(err.jump))
        goto done;
    jpeg_mem_src(&cinfo, (unsigned char *)data, (unsigned long)size);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.data_precision != 8 || cinfo.arith_code ||
        !(cinfo.jpeg_color_space == JCS_YCbCr || cinfo.jpeg_color_space == JCS_GRAYSCALE ||
          cinfo.jpeg_color_space == JCS_RGB))
        goto done;
    cinfo.out_color_space = JCS_EXT_RGB;
    cinfo.dct_method = JDCT_ISLOW;
    cinfo.do_fancy_upsampling = TRUE;
    cinfo.scale_num = 1;
    cinfo.scale_denom = scale;
    jpeg_start_decompress(&cinfo);
    if (cinfo.output_components != 3)
        goto done;
    if ((unsigned long)top + height > cinfo.output_height ||
        (unsigned long)left + width > cinfo.output_width || height == 0 || width == 0) {
        *bad_window = 1;
        goto done;
    }
    {
        /* one iMCU of margin each side, so the upsampler's neighbours are those of a full decode (a
         * full-size iMCU: at a reduced scale that is more than one scaled iMCU, which is enough) */
        JDIMENSION imcu = (JDIMENSION)cinfo.max_h_samp_factor * DCTSIZE;
        JDIMENSION x0 = left > imcu ? left - imcu : 0;
        JDIMENSION x1 = left + width + imcu < cinfo.output_width ? left + width + imcu : cinfo.output_width;
        JDIMENSION xoff = x0, cw = x1 - x0, r;
        JSAMPROW rows[ROWS_PER_CALL];
        if (xoff > 0 || cw < cinfo.output_width)
            jpeg_crop_scanline(&cinfo, &xoff, &cw);
        else
            xoff = 0;
        if (cinfo.output_width > out_cols) {
            *bad_window = 1;
            goto done;
        }
        *shift = left - xoff;
        if (top > 0 && jpeg_skip_scanlines(&cinfo, top) != top)
            goto done;
        /* straight into the caller's rows (no copy: the colour conversion's stores are the only
         * writes to that memory), many rows per call */
        for (r = 0; r < height;) {
            JDIMENSION k, n = height - r < ROWS_PER_CALL ? height - r : ROWS_PER_CALL, got;
            for (k = 0; k < n; k++)
                rows[k] = out + (size_t)(r + k) * out_cols * 3;
            got = jpeg_read_scanlines(&cinfo, rows, n);
            if (got == 0)
                goto done;
            r += got;
        }
        ok = 1;
    }
done:
    jpeg_destroy_decompress(&cinfo);
    return ok;
}

static PyObject *decode_window(PyObject *self, PyObject *args)
{
    Py_buffer src, dst;
    PyObject *target;
    unsigned int top, left, width, scale = 1;
    JDIMENSION shift = 0;
    int ok, bad_window = 0;

    (void)self;
    if (!PyArg_ParseTuple(args, "y*OIII|I", &src, &target, &top, &left, &width, &scale))
        return NULL;
    if (scale != 1 && scale != 2 && scale != 4 && scale != 8) {
        PyBuffer_Release(&src);
        PyErr_Format(PyExc_ValueError, "decode_window: scale must be 1, 2, 4 or 8, not %u", scale);
        return NULL;
    }
    if (PyObject_GetBuffer(target, &dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    if (dst.ndim != 3 || dst.shape[2] != 3 || dst.itemsize != 1) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        PyErr_SetString(PyExc_ValueError, "decode_window: out must be a C-contiguous H x C x 3 uint8 buffer");
        return NULL;
    }
    {
        JDIMENSION height = (JDIMENSION)dst.shape[0], cols = (JDIMENSION)dst.shape[1];
        Py_BEGIN_ALLOW_THREADS
        ok = decode((const unsigned char *)src.buf, (size_t)src.len, (unsigned char *)dst.buf, cols, top, left,
                    height, width, scale, &shift, &bad_window);
        Py_END_ALLOW_THREADS
        if (bad_window)
            PyErr_Format(PyExc_ValueError, "decode_window: the %ux%u window at (%u, %u) is outside the image or "
                         "wider than out's %u columns", height, width, top, left, cols);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (bad_window)
        return NULL;
    if (!ok)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(shift);
}

/* ---- resize_area -------------------------------------------------------------------------- */

/* The weights of an area average of ssize samples onto dsize <= ssize: output d covers
 * [d * scale, (d + 1) * scale) of the source; a source sample it covers whole weighs 1 / cell,
 * one it covers in part its share (shares under 1e-3 are left out), cell being the footprint's
 * length within the source. Fills first[d], count[d] and weight[d * stride + k]; returns the
 * largest count (the caller sizes stride with max_taps). */
static int max_taps(int ssize, int dsize)
{
    double scale = 1.0 / ((double)dsize / ssize);
    return (int)ceil(scale) + 2;
}

static int area_weights(int ssize, int dsize, int *first, int *count, float *weight, int stride)
{
    double scale = 1.0 / ((double)dsize / ssize);
    int d, most = 1;
    for (d = 0; d < dsize; d++) {
        double a = d * scale, b = a + scale, cell = scale < ssize - a ? scale : ssize - a;
        int s0 = (int)ceil(a), s1 = (int)floor(b), s, n = 0;
        float *w = weight + (size_t)d * stride;
        if (s1 > ssize - 1)
            s1 = ssize - 1;
        if (s0 > s1)
            s0 = s1;
        first[d] = s0;
        if (s0 - a > 1e-3) {
            first[d] = s0 - 1;
            w[n++] = (float)((s0 - a) / cell);
        }
        for (s = s0; s < s1 && n < stride; s++)
            w[n++] = (float)(1.0 / cell);
        if (b - s1 > 1e-3 && n < stride) {
            double part = b - s1 < 1.0 ? b - s1 : 1.0;
            w[n++] = (float)((part < cell ? part : cell) / cell);
        }
        count[d] = n;
        if (n > most)
            most = n;
    }
    return most;
}

static void store_u8(const float *v, unsigned char *o, int n)
{
    int i = 0;
#if defined(__SSE2__)
    for (; i + 16 <= n; i += 16) {
        __m128i a = _mm_cvtps_epi32(_mm_loadu_ps(v + i)), b = _mm_cvtps_epi32(_mm_loadu_ps(v + i + 4));
        __m128i c = _mm_cvtps_epi32(_mm_loadu_ps(v + i + 8)), d = _mm_cvtps_epi32(_mm_loadu_ps(v + i + 12));
        _mm_storeu_si128((__m128i *)(o + i), _mm_packus_epi16(_mm_packs_epi32(a, b), _mm_packs_epi32(c, d)));
    }
#endif
    for (; i < n; i++) {
        long r = lrintf(v[i]);
        o[i] = (unsigned char)(r < 0 ? 0 : r > 255 ? 255 : r);
    }
}

/* src: sh rows of sw RGB pixels, row r at src + r * pitch; out: dh x dw x 3, contiguous. */
static int area(const unsigned char *src, Py_ssize_t pitch, int sh, int sw, unsigned char *out, int dh, int dw)
{
    int xstride = max_taps(sw, dw), ystride = max_taps(sh, dh), taps, n = dw * 3, dy, ok = 0;
    int *xfirst = malloc(sizeof(int) * dw), *xcount = malloc(sizeof(int) * dw);
    int *yfirst = malloc(sizeof(int) * dh), *ycount = malloc(sizeof(int) * dh);
    float *xw = calloc((size_t)dw * xstride, sizeof(float)), *yw = calloc((size_t)dh * ystride, sizeof(float));
    /* one float past each row's end: the last pixel's 4-lane load and store */
    float *row = calloc((size_t)(sw + xstride) * 3 + 1, sizeof(float));
    float *buf = malloc(sizeof(float) * (n + 1)), *sum = malloc(sizeof(float) * n);
    if (!xfirst || !xcount || !yfirst || !ycount || !xw || !yw || !row || !buf || !sum)
        goto done;
    /* every output sums the same number of taps, the missing ones weighing 0: adding 0 * x leaves
     * a sum of non-negative terms exactly as it was */
    taps = area_weights(sw, dw, xfirst, xcount, xw, xstride);
    area_weights(sh, dh, yfirst, ycount, yw, ystride);
    for (dy = 0; dy < dh; dy++) {
        int k, i, t;
        for (t = 0; t < ycount[dy]; t++) {
            int sy = yfirst[dy] + t;
            float beta = yw[(size_t)dy * ystride + t];
            const unsigned char *s = src + (Py_ssize_t)sy * pitch;
            /* a source row feeding two output rows is filtered once: it is the last row of dy - 1
             * and the first of dy, so buf still holds it when t == 0 */
            if (!(t == 0 && dy > 0 && yfirst[dy - 1] + ycount[dy - 1] - 1 == sy)) {
                for (i = 0; i < sw * 3; i++)
                    row[i] = (float)s[i];
                for (k = 0; k < dw; k++) {
                    const float *p = row + 3 * xfirst[k], *w = xw + (size_t)k * xstride;
                    int m;
#if defined(__SSE2__)
                    __m128 acc = _mm_setzero_ps();
                    for (m = 0; m < taps; m++, p += 3)
                        acc = _mm_add_ps(acc, _mm_mul_ps(_mm_loadu_ps(p), _mm_set1_ps(w[m])));
                    _mm_storeu_ps(buf + 3 * k, acc); /* the fourth lane is overwritten by k + 1 */
#else
                    float r = 0.f, g = 0.f, b = 0.f;
                    for (m = 0; m < taps; m++, p += 3) {
                        r += p[0] * w[m];
                        g += p[1] * w[m];
                        b += p[2] * w[m];
                    }
                    buf[3 * k] = r;
                    buf[3 * k + 1] = g;
                    buf[3 * k + 2] = b;
#endif
                }
            }
            if (t == 0)
                for (i = 0; i < n; i++)
                    sum[i] = beta * buf[i];
            else
                for (i = 0; i < n; i++)
                    sum[i] += beta * buf[i];
        }
        store_u8(sum, out + (size_t)dy * n, n);
    }
    ok = 1;
done:
    free(xfirst);
    free(xcount);
    free(yfirst);
    free(ycount);
    free(xw);
    free(yw);
    free(row);
    free(buf);
    free(sum);
    return ok;
}

static PyObject *resize_area(PyObject *self, PyObject *args)
{
    Py_buffer src, dst;
    PyObject *source, *target;
    int ok = 0;

    (void)self;
    if (!PyArg_ParseTuple(args, "OO", &source, &target))
        return NULL;
    if (PyObject_GetBuffer(source, &src, PyBUF_STRIDED_RO) < 0)
        return NULL;
    if (PyObject_GetBuffer(target, &dst, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    if (src.ndim != 3 || src.shape[2] != 3 || src.itemsize != 1 || src.strides[2] != 1 || src.strides[1] != 3 ||
        src.strides[0] < 3 * src.shape[1] || dst.ndim != 3 || dst.shape[2] != 3 || dst.itemsize != 1 ||
        dst.shape[0] < 1 || dst.shape[1] < 1 || dst.shape[0] > src.shape[0] || dst.shape[1] > src.shape[1] ||
        src.shape[0] > 1 << 24 || src.shape[1] > 1 << 24) {
        PyBuffer_Release(&src);
        PyBuffer_Release(&dst);
        PyErr_SetString(PyExc_ValueError, "resize_area: src must be H x W x 3 uint8 with contiguous pixels, out a "
                        "C-contiguous h x w x 3 uint8 buffer no larger than src");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    ok = area((const unsigned char *)src.buf, src.strides[0], (int)src.shape[0], (int)src.shape[1],
              (unsigned char *)dst.buf, (int)dst.shape[0], (int)dst.shape[1]);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    if (!ok)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_window", decode_window, METH_VARARGS,
     "decode_window(payload, out, top, left, width, scale=1) -> shift or None: rows top .. top + H of the\n"
     "columns around left .. left + width, RGB, into out (H x C x 3 uint8, C >= width + 96 or the image's\n"
     "width); the window is out[:, shift:shift + width]. scale 2, 4 or 8: the image decoded at 1/scale of\n"
     "its size (libjpeg-turbo's reduced-size IDCT), the window in its pixels. None: decode the payload\n"
     "whole instead (damaged, CMYK, ...)."},
    {"resize_area", resize_area, METH_VARARGS,
     "resize_area(src, out): src (H x W x 3 uint8, rows may be strided) shrunk into out (h x w x 3, h <= H,\n"
     "w <= W) as OpenCV's INTER_AREA shrinks at a non-integer ratio, the same bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jpegwindow", "A JPEG window decoded with libjpeg-turbo, skipping what lies outside it; INTER_AREA shrinks.",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jpegwindow(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "libjpeg_turbo", BUILT_AGAINST) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
