"""Run the fault-injection sweeps of tests/conversion/test_faults.py (same seeds, same trial counts), the
hostile-input tests and the trust tests, and print the tables of docs/reliability.md.

    python -m tools.fault_table [--quick]

Each SIGKILL trial kills a real conversion (``python -m packer convert``, 120 images, PNG) at a
moment spread over its run, then runs ``--resume``; each byte trial flips one byte (or cuts the
file) in a copy of a finished dataset and runs ``packer verify`` and a reader over every sample.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

from tools import faultlib as fl

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")


def kill_rows(src: str, work: str, kills: int, overwrite: int, two_workers: int) -> list[list[str]]:
    rows = []
    for fmt in fl.FORMATS:
        ref = os.path.join(work, f"ref-{fmt}")
        timing = fl.timed_run(fmt, src, ref)
        snap = fl.snapshot(ref)
        runs = [("", 1, None, fl.kill_delays(kills, timing, 2024))]
        if overwrite:
            old = os.path.join(work, f"old-{fmt}")
            subprocess.run(fl.convert_argv(fmt, src, old, "--resize", "shorter:64"), check=True, capture_output=True)
            runs.append((" --overwrite", 1, old, fl.kill_delays(overwrite, timing, 99)))
        if two_workers and fmt in ("lmdb", "tar"):
            t2 = fl.timed_run(fmt, src, os.path.join(work, f"timed2-{fmt}"), workers=2)
            runs.append((" --workers 2", 2, None, fl.kill_delays(two_workers, t2, 5)))
        for label, workers, old, delays in runs:
            start, end = timing if workers == 1 else t2
            c: collections.Counter = collections.Counter()
            kept = []
            for k, delay in enumerate(delays):
                t = fl.kill_trial(fmt, src, ref, snap, os.path.join(work, f"k-{fmt}-{k}"), delay, workers=workers,
                                  old=old)
                c[t.outcome] += 1
                c["lost"] += t.lost
                c["bad"] += (not t.dst_ok) + (not t.tmp_refused) + bool(t.errors) + (not t.resume_ok)
                c["identical"] += t.identical
                if t.resumed > 0:
                    kept.append(t.resumed)
            n = len(delays)
            rows.append([
                f"{fmt}{label}", str(n), f"{start:.2f} / {end:.2f} s", f"{c['absent']} / {c['complete'] + c['old']}",
                f"{len(kept)} (median {sorted(kept)[len(kept) // 2] if kept else 0} of {len(snap)})",
                str(c["lost"]), f"{c['identical']}/{n}", str(c["bad"]),
            ])
    return rows


def byte_rows(work: str, src: str, uniform: int, structure: int, cuts: int) -> list[list[str]]:
    rows = []
    for fmt in fl.FORMATS:
        ref = os.path.join(work, f"ref-{fmt}")
        if not os.path.exists(ref):
            subprocess.run(fl.convert_argv(fmt, src, ref), check=True, capture_output=True)
        snap, regions = fl.snapshot(ref), fl.sample_regions(ref)
        rng = random.Random(2024)
        plans = [("flip, uniform", fl.flip_offsets(ref, uniform, 2024), "flip"),
                 ("flip, structures", fl.structure_offsets(ref, regions, structure, 2024), "flip"),
                 ("cut short", fl.flip_offsets(ref, cuts, 2025), "truncate")]
        for label, offsets, kind in plans:
            c: collections.Counter = collections.Counter()
            for name, off in offsets:
                t = fl.byte_trial(ref, os.path.join(work, "w"), snap, regions, name, off, kind=kind, rng=rng)
                c["verify"] += t.verify_rc != 0 and t.verify_named_file
                if t.expected_sample is not None:
                    c["attributable"] += 1
                    c["named"] += t.verify_named_sample
                c[t.reader] += 1
            n = len(offsets)
            rows.append([
                fmt, label, str(n), f"{c['verify']}/{n}", f"{c['named']}/{c['attributable']}",
                f"{c['refused']} / {c['raised']} / {c['correct']}", str(c["wrong"] + c["leak"]),
                str(n - c["verify"] + c["wrong"] + c["leak"]),
            ])
    return rows


#: test in tests/formats/test_hostile.py -> (hostile input, what must happen)
HOSTILE = {
    "test_no_unsafe_deserialisation_in_any_reader": (
        "code paths that could run code from data (pickle, marshal, torch.load, yaml.load, eval, np.load "
        "without allow_pickle=False)", "none in packer/, converters/, datasets/ (AST scan)"),
    "test_npy_member_with_object_dtype_is_refused": (
        "foreign tar whose .npy member declares an object array (a pickle payload)", "CorruptDataError, nothing unpickled"),
    "test_hdf5_non_integer_datasets_are_refused": (
        "HDF5 /labels, /shapes, /crc32c, /images replaced by string, float, vlen datasets",
        "CorruptDataError naming the dataset"),
    "test_tar_member_names_are_keys_never_paths": (
        "foreign tar with '../x', '/abs/x', backslash names, symlink and hardlink members, unpacked to an "
        "imagefolder", "links are not samples; every file written inside DST, no link created, renames reported"),
    "test_crafted_tfrecord_length_is_refused_before_allocating": (
        "foreign TFRecord with a 1 TiB length field (valid length CRC), and a bad length CRC",
        "CorruptDataError at open, < 50 MB allocated"),
    "test_hostile_index_and_manifest_cannot_make_a_reader_allocate": (
        "TFRecord .idx, tar index and HDF5 /offsets forged with valid checksums (and the manifest) to promise 1 TiB",
        "CorruptDataError on read, < 50 MB allocated"),
    "test_images_above_the_pixel_limit_are_refused_before_decoding": (
        "source PNG whose header claims 100,000 x 100,000 pixels; --max-pixels below every image",
        "skipped before the decoder sees it, with the reason; one-line error when nothing is left"),
    "test_placeholder_payload_files_are_named": (
        "a git-LFS pointer or an HTML error page in place of data.mdb, data.h5, a shard or an index",
        "one-line CorruptDataError saying what the file is; verify exits 1"),
    "test_placeholder_foreign_shards_are_named": (
        "git-LFS pointer saved as a foreign .tar / .tfrecord", "one-line error naming it"),
    "test_converting_from_a_placeholder_source_is_one_line": (
        "packer convert from an LMDB whose data.mdb is a git-LFS pointer", "exit 1, one line"),
    "test_disk_full_on_a_small_tmpfs": (
        "DST on a 2 MB tmpfs (real ENOSPC)", "exit 1, one line 'disk full ... while writing PATH', nothing left, "
        "source unchanged"),
    "test_file_size_limit_in_a_subprocess": (
        "RLIMIT_FSIZE of 1 MiB (EFBIG)", "exit 1, one line 'file size limit ...', nothing left"),
    "test_injected_enospc_in_process": (
        "ENOSPC injected into shard writes after checkpoints exist", "DiskFullError, partial output removed, not kept"),
}


TRUST = {
    "test_destination_overlapping_source_is_refused": (
        "DST equal to SRC (also with '/', '..', a symlink), SRC's parent, inside SRC, inside a symlink to SRC; "
        "--overwrite; 4 formats", "exit 1, one line, no file of SRC deleted or written"),
    "test_packed_source_overlapping_destination_is_refused": (
        "packed SRC converted or unpacked onto itself, its parent, inside itself", "exit 1, nothing changed"),
    "test_check_destination_by_identity_bind_or_hardlinked_path": (
        "the same folder spelled another way", "refused by path and by inode"),
    "test_second_conversion_to_a_claimed_destination_fails_at_once": (
        "a second conversion to a DST another process is converting to; 4 formats",
        "exit 1 within 5 s naming the owner's pid; a killed owner's claim does not block"),
    "test_stale_claim_of_a_killed_conversion_does_not_block_resume": (
        "SIGKILL mid-conversion, then --resume", "the stale claim is taken over, the resume completes"),
    "test_claim_is_exclusive_between_processes_and_reentrant_within_one": (
        "claims from two processes; nested in one", "the second process is refused; nesting works; no file left"),
    "test_concurrent_conversions_never_publish_a_mismatched_dataset": (
        "three CLI conversions to one DST at once, --overwrite; 4 formats",
        "each exits 0 or names the other; the published dataset verifies"),
    "test_overwrite_under_an_open_reader_fails_clearly_in_new_workers": (
        "--overwrite while a map-style reader is open; non-persistent DataLoader workers; 4 formats",
        "open handles read the old data; new opens raise DatasetChangedError, never the new data"),
    "test_overwrite_under_a_streaming_dataset_fails_clearly": (
        "--overwrite under a StreamingDataset; 4 formats", "DatasetChangedError in the workers"),
    "test_payload_file_from_another_conversion_is_refused_at_open": (
        "a payload file replaced by the same-named file of another conversion; 4 formats",
        "CorruptDataError at open (size)"),
    "test_payload_file_of_equal_size_from_another_conversion_is_refused": (
        "every file replaced by another conversion's file of equal size (raw); 4 formats",
        "CorruptDataError (file id at open for HDF5, place check per sample otherwise)"),
    "test_shards_of_equal_size_swapped_on_disk_are_refused": (
        "two shards of equal size swapped with their indexes; tar, TFRecord", "CorruptDataError"),
    "test_lmdb_record_reached_through_a_wrong_pointer_is_refused": (
        "an LMDB key leading to another sample's intact record (what a flipped page number does)",
        "CorruptDataError naming the sample"),
    "test_a_sample_table_that_is_not_the_datasets_own_is_refused": (
        "samples.table from another conversion (same size), or written again with two labels changed and its "
        "checksums recomputed; 4 formats",
        "ds.targets, ds.keys, fields=('key',) and StreamingDataset raise one line naming the table (were wrong "
        "for 138 and 200 of 201 samples); verify exits 1 naming it"),
    "test_a_damaged_table_is_reported": (
        "one byte of the sample table's keys or metadata section flipped (table version 3); 4 formats",
        "targets read (the labels section is checked and intact); the first ds.keys, ds.meta(i) or "
        "fields=('key', 'meta') read raises one line naming the table and the section; verify exits 1 naming them"),
    "test_merge_refuses_a_part_file_from_another_conversion_before_copying": (
        "a merge part holding another conversion's sample table or payload file of equal size (4 formats), or "
        "tar index", "refused before anything is copied, one line naming the part and the file (the table's "
        "keys were merged into a dataset that verified)"),
    "test_manifest_file_names_outside_the_dataset_are_refused": (
        "files[].name of '../x', an absolute path, '', '..', a backslash; 4 formats", "verify exits 1, one line"),
    "test_symlinked_payload_is_refused": ("a payload file that is a symlink; 4 formats",
                                          "CorruptDataError; verify reports it"),
    "test_fifo_in_place_of_a_packed_file_does_not_hang": (
        "a FIFO as manifest.json or .idx", "info/verify exit 1 at once"),
    "test_malformed_class_lists_are_refused": (
        "classes duplicated, a string, an object, numbers, null", "ManifestError"),
    "test_malformed_sample_counts_are_refused": (
        "num_samples of -1, 1e400, 5,000 digits, a string, true, 2^63, 2.0", "exit 1, one line"),
    "test_deeply_nested_manifest_is_refused": ("manifest.json nested 100,000 deep", "exit 1, one line"),
    "test_jpegs_libjpeg_only_warns_about_are_skipped_with_the_warning": (
        "JPEG truncated with an end marker appended; garbled scan data (OpenCV decodes both silently)",
        "skipped with libjpeg's warning, 1 and 2 workers; --keep-damaged-jpeg keeps them"),
    "test_empty_and_damaged_foreign_payloads_are_skipped_not_copied": (
        "a WebDataset tar with a 0-byte and a garbled .jpg, copied to lmdb, tar, imagefolder",
        "both skipped with the reason (exit 3); sizes from the header"),
    "test_empty_payload_in_a_packed_dataset_is_an_error_at_read_and_in_verify": (
        "a packed sample with a 0-byte payload (CRC 0)", "CorruptDataError at read; verify reports it"),
    "test_skips_are_counted_across_workers_and_never_exhaust_over_epochs": (
        "on_error='skip', one bad sample in four, 10 epochs in-process and 3 through 2 DataLoader workers",
        "a warning per skip; ds.errors counts every process's skips; never raises"),
    "test_a_thousand_consecutive_bad_samples_are_skipped_without_recursion": (
        "on_error='skip' with 1,050 bad samples in a row; with every sample bad",
        "the next good sample, no RecursionError; one CorruptDataError when all fail"),
    "test_corrupt_data_error_keeps_its_fields_across_a_dataloader_worker": (
        "CorruptDataError raised in a DataLoader worker", "path, sample and offset set in the training process"),
    "test_non_integer_indices_are_a_clear_type_error": (
        "ds[1.0], ds['a'], ds[0:2], ds[None], ds[True]", "TypeError saying indices must be integers"),
    "test_writer_options_a_format_does_not_take_are_refused": (
        "--shard-size, --shard-samples, --gzip, --checkpoint-samples given to a format that does not take them",
        "exit 2, one line naming the formats that do; ValueError in Python"),
    "test_home_relative_paths_are_expanded": ("open_dataset('~/...') and StreamingDataset('~/...')", "opens"),
    "test_upscale_output_is_bounded_by_max_pixels_before_decoding": (
        "--upscale of a 1 x 3000 PNG to shorter:256", "skipped before decoding: the output is above --max-pixels"),
    "test_huge_or_negative_foreign_labels_are_one_clear_error": (
        "foreign .cls of 3e8, 2^63, -5", "one CorruptDataError naming the member, no class list built"),
    "test_other_tools_tfrecord_names_read_every_sample": (
        "other tools' TFRecord files named .tfrecords, .tfr, train-00000-of-01024",
        "every sample through ds[i] and StreamingDataset (was IndexError / 0 samples)"),
    "test_a_directory_without_manifest_is_told_for_what_it_is": (
        "an image folder, another tool's LMDB or tar shards, unfinished output given to open_dataset/info/verify",
        "one line saying what it is and what to do (only unfinished output is told to re-run)"),
    "test_malloc_tuning_reports_a_failure_every_time_not_only_the_first": (
        "malloc tuning failing in a DataLoader worker", "reported as failed on every call"),
    "test_nested_manifest_fields_of_the_wrong_type_are_one_line_naming_the_field": (
        "manifest processing, skipped[], files[], layout, ignored, shuffle_seed, created_by of the wrong JSON type "
        "or missing; an unknown format name", "info and verify exit 1 with one line naming the field; ManifestError"),
    "test_manifest_strings_with_lone_surrogate_escapes_are_refused_naming_the_field": (
        "a manifest class name written as 'caf\\udce9' (a lone surrogate escape, valid JSON)",
        "info, verify and convert exit 1 with one line naming classes[0] (convert raised UnicodeEncodeError)"),
    "test_a_sample_count_the_files_cannot_hold_is_refused_at_once": (
        "num_samples of 10^15 with files[] forged to agree; 4 formats",
        "info and verify exit 1 at once (verify looped for ever, TFRecord tried to allocate 3.5 PiB)"),
    "test_a_sample_count_the_payload_does_not_hold_is_one_problem_in_verify": (
        "num_samples forged to the payload file's byte count; 4 formats",
        "verify: one 'cannot open' problem (was one per sample; HDF5 reopened the file 1.4 million times)"),
    "test_hdf5_rows_declared_but_not_stored_are_refused_before_allocating": (
        "a 10 kB data.h5 whose per-sample datasets declare 50 million rows",
        "CorruptDataError at open, peak RSS within 100 MB of a bare import (was 2.2 GB)"),
    "test_hdf5_rows_the_manifest_agrees_with_but_the_file_does_not_store_are_refused": (
        "HDF5 /labels of 4,000 rows with no chunk stored, the manifest forged to agree",
        "CorruptDataError: rows declared but not stored"),
    "test_hdf5_keys_declared_but_not_stored_are_refused_before_reading": (
        "HDF5 /keys as two 100 MB fixed-width strings, nothing stored",
        "CorruptDataError at open, peak RSS within 100 MB of a bare import (read_record read 200 MB)"),
    "test_hdf5_image_rows_whose_size_overflows_int64_are_refused": (
        "HDF5 raw /images rows of 2^32 x 2^32 x 3 bytes (their size wrapped to 0 in int64)",
        "CorruptDataError at open: the bytes are not stored"),
    "test_hdf5_one_byte_chunks_do_not_make_a_chunk_table": (
        "HDF5 /images in 1-byte chunks over a 270 MB extent", "every sample read, peak RSS within 100 MB of a bare "
        "import (was 2.3 GB)"),
    "test_names_that_are_not_utf8_are_skipped_shown_escaped_not_a_crash": (
        "source file, sub-folder and class folder names that are not UTF-8 (b'caf\\xe9.jpg'); 4 formats",
        "skipped, shown escaped, with the reason (exit 3); the manifest stays UTF-8 (was: the conversion aborted)"),
    "test_a_source_and_destination_inside_a_folder_whose_name_is_not_utf8": (
        "SRC and DST inside a folder named b'd\\xe9j\\xe0'; convert, verify, convert again; 4 formats",
        "exit 0 each (LMDB failed with a raw UnicodeEncodeError: py-lmdb takes only UTF-8 paths)"),
    "test_folder_symlinks_out_of_a_class_folder_are_not_followed": (
        "'loop -> ..', '-> ../b', a loop below the class, a link to a folder outside the source",
        "the first three reported and not followed (b's images were packed as a's); the outside link followed"),
    "test_a_skip_reason_never_shows_the_files_bytes": (
        "a source .jpg that is a symlink to a text file", "skipped; none of its bytes in the reason or manifest"),
    "test_foreign_tar_member_names_that_are_not_utf8_are_read": (
        "WebDataset tar members named b'caf\\xe9.jpg', converted to lmdb and imagefolder",
        "every sample converted, keys valid UTF-8 (was UnicodeEncodeError for the whole conversion)"),
    "test_tfrecord_index_lengths_beyond_int64_are_one_line": (
        "a TFRecord .idx (manifest forged to match) with a record length of 2^63-1, 2^64-1, -16",
        "verify: one 'cannot open' line (2^64-1 raised OverflowError; 2^63-1 overflowed with a warning)"),
    "test_compressed_foreign_tfrecord_is_told_for_what_it_is": (
        "another tool's ZLIB- and gzip-compressed TFRecord files, converted and given to info",
        "one line saying how it is compressed and what to do (ZLIB was 'checksum mismatch'; info said "
        "'TFRecord files written by another tool')"),
    "test_compressed_tar_shards_are_told_for_what_they_are": (
        "a folder of .tar.gz shards given to convert and info; one given to open_dataset",
        "one line: compressed tar shards are not read, gunzip them (was 'no .tar shards')"),
    "test_hdf5_disk_filled_after_the_space_check_is_one_line_not_a_crash": (
        "DST on a 2 MB tmpfs filled after HDF5's free-space check passed; 1 and 2 workers",
        "exit 1, one line 'disk full', nothing left (was h5py tracebacks and a SIGSEGV at exit)"),
    "test_hdf5_disk_full_with_busy_workers_exits": (
        "HDF5 conversion of 200 raw 256x256 images onto a 2 MB tmpfs, 2 and 3 workers holding answers larger than a "
        "pipe", "exit 1 within 60 s, one line 'disk full', nothing left (was: the line printed, then a wait on the "
        "blocked workers forever)"),
    "test_a_dataset_file_that_fails_its_open_check_is_opened_once_per_process": (
        "on_error='skip' over a dataset whose payload file is another conversion's; 12 samples, 2 epochs; 4 formats",
        "every sample refused with CorruptDataError; the payload file opened at most once in the process (HDF5 and "
        "TFRecord opened it 288 times)"),
    "test_torchrun_ranks_that_see_other_files_fail_the_job": (
        "torchrun on two nodes: rank 1's copy of SRC stale (one file with other bytes and time, same SRC argument), "
        "or rank 1 given another SRC", "every rank exits non-zero naming rank 1 and the file (or both SRCs) before "
        "converting; nothing published (was exit 0 with rank 1's images under rank 0's labels)"),
    "test_torchrun_stopped_rank_fails_the_job_after_the_timeout": (
        "torchrun, 2 ranks, `--rank-timeout 3`: rank 1 SIGSTOPped while it converts", "rank 0 exits non-zero within "
        "60 s naming rank 1 as silent for 3 s; nothing published (was a wait for the collective's 24-hour timeout)"),
    "test_merge_refuses_parts_that_disagree_about_a_source_file": (
        "convert_items parts of the same file key made from different copies of it",
        "merge refuses naming the file and both parts, writes nothing (was merged silently)"),
    "test_list_rows_outside_the_root_are_refused_naming_them": (
        "list rows '../secret.png' and an absolute path outside --root (and outside the list's folder when no "
        "--root is given); --allow-outside-root", "exit 1, one line naming the rows and their lines, nothing written "
        "(were packed, exit 0); with the option all 5 packed"),
    "test_list_rows_through_a_symlink_in_the_root_are_followed": (
        "a list row through a folder symlink inside --root that leads out of it",
        "followed, as in an image folder (the rule is on the path the list writes)"),
    "test_a_list_key_or_column_named_twice_is_an_error": (
        "a JSON Lines row with 'path' or 'label' twice; a CSV/TSV header naming a column twice",
        "SourceError naming the list file, line and key (JSON kept the last value, CSV the last column)"),
    "test_list_rows_that_are_fifos_devices_or_huge_are_skipped_unread": (
        "list rows naming a FIFO, /dev/zero (through a symlink) and a 65 MiB sparse file under --max-pixels 1000",
        "each skipped unread with the reason, exit 3 (the FIFO blocked for ever, /dev/zero was a MemoryError)"),
    "test_lists_that_are_not_files_endless_or_deeply_nested_are_one_line": (
        "a list that is a FIFO or /dev/zero; a 4 MiB line; JSON nested 100,000 deep; metadata nested 100 deep",
        "SourceError naming the list (and line) and the reason (were a hang, a MemoryError, a RecursionError)"),
    "test_a_list_with_a_byte_order_mark_is_read": (
        "CSV, TSV and JSON Lines lists starting with a UTF-8 byte-order mark", "read (the CSV's path column was not found)"),
    "test_list_rows_naming_one_file_with_conflicting_labels_are_refused": (
        "one file on two list rows ('a/a0.jpg' and './a/a0.jpg') with different labels; with the same labels",
        "SourceError naming both lines (was packed twice, exit 0); the same label twice is accepted"),
    "test_an_unlabelled_multi_label_sample_is_an_empty_int64_list": (
        "multi-label samples with no class written to TFRecord; an earlier version's empty bytes list",
        "an empty int64 list, read by the tfrecord package's typed loader (TensorFlow stopped there); old one read"),
    "test_foreign_tfrecord_labels_that_are_not_one_class_number_are_refused_naming_the_record": (
        "another tool's TFRecord whose image/class/label holds [1, 2], b'cat', [0.5] or nothing",
        "CorruptDataError naming the file and record and what the label holds (was its first value, or "
        "'-1 is negative')"),
    "test_foreign_tfrecords_in_tensorflows_image_raw_and_label_convention_are_read": (
        "another tool's TFRecord with TensorFlow's tutorial names image_raw, label, height, width, depth",
        "every sample and label read, depth kept as metadata; converts (was refused)"),
    "test_manifests_with_a_wrong_first_no_classes_or_no_files_are_one_line": (
        "a manifest's files[].first off by 2, classes [], files [] with num_samples 0; 4 formats",
        "ManifestError; verify and info exit 1 with one line naming the manifest (were struct.error, accepted, "
        "StopIteration)"),
    "test_node_cache_disk_full_read_only_and_symlinks_are_one_line_naming_file_and_url": (
        "node cache on a 2 MB tmpfs (real ENOSPC), remounted read-only (EROFS), a symlink planted as a cached "
        "file (ELOOP)", "NodeCacheError naming the cache file, the URL and what to do; no download file left open"),
    "test_numpy_integer_windows_are_ints_and_other_types_are_refused": (
        "a crop window of np.uint8 values (top + height wraps at 256); floats, bools, three values",
        "the window's pixels, window decode included (was an empty image); TypeError naming the sample"),
}

#: The files of the trust tests (TRUST), each in the folder of tests/ for the part of packer it tests.
TRUST_FILES = ("files/test_destinations.py", "datasets/test_dataset_identity.py", "description/test_manifest_checks.py",
               "images/test_damaged_images.py", "description/test_places.py", "formats/test_writer_options.py",
               "datasets/test_read_errors.py", "formats/test_foreign_files.py", "formats/test_hdf5_bounds.py",
               "pipeline/test_source_names.py", "conversion/test_torchrun_faults.py", "sources/test_list_rows.py",
               "storage/test_node_cache_failures.py", "images/test_crop_windows.py",
               "description/test_metadata.py")

#: JPEGs that decode to wrong pixels without a libjpeg warning (tests/images/test_imageproc.py, tests/datasets/test_crop.py).
JPEG = {
    "test_cut_jpegs_with_an_end_marker_are_skipped_as_truncated": (
        "arithmetic-coded baseline and progressive JPEGs, and a Huffman progressive one, cut within a scan or "
        "between two scans, an end marker appended (libjpeg decodes them without a warning, up to 255 levels off)",
        "skipped as truncated in conversion and in copies, with the reason; --keep-damaged-jpeg keeps them"),
    "test_a_foreign_tfrecord_with_wrong_sizes_gets_the_window_of_its_jpegs": (
        "crop= over another tool's TFRecord whose image/height and image/width are not its JPEG's",
        "the window of the whole decode cut the same way (was another window), placed by the JPEG's header"),
    "test_arithmetic_coded_jpegs_are_decoded_whole_and_cut": (
        "crop= over arithmetic-coded JPEGs, whole and cut (the window decode's libjpeg-turbo differed by up to 47 levels)",
        "decoded whole and cut: the same pixels as without crop="),
}


REMOTE = {
    "test_a_forged_file_size_reserves_nothing_and_names_the_url": (
        "a manifest claiming 600,000,000 bytes for a 10 kB shard, read with no cache_limit",
        "CorruptDataError naming the URL and both sizes before downloading; the cache's disk use, polled every "
        "millisecond, under 10 MiB (was 600 MB reserved, then a SHA-256 error)"),
    "test_every_file_in_the_cache_counts_against_the_limit_whatever_its_name": (
        "manifest files named x0.fetch, x1.fetch, x2.partial, x3.ahead, x4.fetch (60 kB each) fetched under a "
        "150 kB limit",
        "usage() equals the disk use of every file; the disk use stays under the limit (was 254 kB held while "
        "usage() said 70 kB)"),
    "test_a_symlink_planted_as_a_dataset_folder_is_not_followed": (
        "a dataset folder of the cache replaced by a symlink to a folder outside it, then the dataset read",
        "the link is removed, every sample exact, nothing written outside the cache (was 50 files written there)"),
    "test_a_killed_downloaders_partial_is_reclaimed_for_another_file": (
        "a downloader SIGKILLed mid-file (4 MiB partial left), then another file fetched under a 6 MiB limit",
        "the partial is reclaimed and the file cached within the limit (was CacheFullError)"),
    "test_read_ahead_larger_than_the_cache_limit_reads_every_sample": (
        "StreamingDataset from s3://, 2 workers reading 2 shards ahead each, cache_limit of 3 shards (a quarter of the "
        "dataset)", "every sample once, the same as the local copy (was CacheFullError: the files in use fill "
        "cache_limit)"),
    "test_a_second_conversion_to_a_url_being_uploaded_is_refused_and_touches_nothing": (
        "a second conversion to an s3:// URL while the first waits on its uploads (its local copy finished); "
        "the first then finishes, or is SIGKILLed and resumed",
        "exit 1, one line naming the first's pid; no file of the node-cache upload folder touched; the first (or "
        "its --resume) publishes the dataset (was: the second deleted the first's copy)"),
    "test_a_server_that_answers_every_request_slowly_fails_the_file_within_its_deadline": (
        "a server answering every request in 0.5 s, a shard read 512 bytes a request under a 2 s deadline",
        "RemoteError naming the shard's URL within 3 s (a per-request bound let it run for ever)"),
    "test_a_stalled_server_fails_each_file_within_the_deadline": (
        "a server that stops answering (a proxy holds every request) under a 2 s deadline: a shard read, "
        "open_dataset, packer info --remote-deadline 2", "RemoteError naming the shard's or manifest's URL, 'no answer "
        "within 2 s'; info exits 1 with that one line; all three within 30 s (was minutes of botocore and s3fs "
        "retries)"),
    "test_verify_of_a_url_with_a_cache_limit_below_the_dataset_says_the_limit_it_needs": (
        "packer verify s3://... of a healthy 24-sample tar dataset with --cache-limit 4 shards",
        "exit 1, one line saying the cache limit needed; with that limit verify passes (was 'missing payload file')"),
}


#: The node-wide RAM cache (tests/datasets/shm/test_node_cache.py).
NODE_RAM = {
    "test_ranks_started_at_the_same_instant_commit_one_segment": (
        "two ranks of one job (same TORCHELASTIC_RUN_ID) past a barrier open one dataset with cache='decoded' "
        "(256 MiB); 3 rounds",
        "one segment of /dev/shm, never two: /dev/shm's use polled every millisecond below 1.5 copies (was 2: the "
        "loser of the race for the name committed a whole segment of its own)"),
}


def hostile_rows(test_file: str | tuple[str, ...] = "formats/test_hostile.py", names: dict | None = None,
                 only: bool = False) -> list[list[str]]:
    """One row per test of ``test_file`` (a path under tests/, or several) that ``names`` describes;
    ``only``: run those tests alone."""
    import pytest

    names = HOSTILE if names is None else names

    results: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    class Collect:
        def pytest_runtest_logreport(self, report):  # noqa: ANN001
            if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
                results[report.nodeid.split("::", 1)[1].split("[")[0]][report.outcome] += 1

    select = ["-k", " or ".join(names)] if only else []
    files = (test_file,) if isinstance(test_file, str) else test_file
    pytest.main([*(os.path.join(TESTS, f) for f in files), "-q", "-p", "no:cacheprovider", "-o", "addopts=", *select],
                plugins=[Collect()])
    rows = []
    for name, c in results.items():
        if name not in names:
            continue
        what, want = names[name]
        n = sum(c.values())
        outcome = f"{c['passed']}/{n} as required" + (f", {c['skipped']} skipped" if c["skipped"] else "")
        rows.append([what, want, outcome + (f", {c['failed']} FAILED" if c["failed"] else "")])
    return rows


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def trust_only() -> None:
    """Print only the trust table (``--trust``): about 90 s."""
    print(table(["fault", "required", "outcome"], hostile_rows(TRUST_FILES, TRUST)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 kills, 3 flips, 2 cuts per format (the default test run)")
    p.add_argument("--trust", action="store_true", help="only the trust tests' table")
    a = p.parse_args()
    if a.trust:
        trust_only()
        return 0
    kills, overwrite, two, uniform, structure, cuts = (2, 0, 0, 2, 1, 2) if a.quick else (20, 5, 5, 20, 20, 10)
    t0 = time.time()
    work = tempfile.mkdtemp(prefix="packer-faults-")
    try:
        src = fl.make_source(os.path.join(work, "src"))
        krows = kill_rows(src, work, kills, overwrite, two)
        brows = byte_rows(work, src, uniform, structure, cuts)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    hrows = hostile_rows()
    trows = hostile_rows(TRUST_FILES, TRUST)
    rrows = hostile_rows("storage/test_remote.py", REMOTE, only=True)
    jrows = hostile_rows("images/test_imageproc.py", JPEG) + hostile_rows("datasets/test_crop.py", JPEG)
    nrows = hostile_rows("datasets/shm/test_node_cache.py", NODE_RAM, only=True)
    print("\n## SIGKILL during conversion, then --resume\n")
    print(table(["format", "kills", "writing starts / run ends", "DST absent / complete", "resumes that kept samples",
                 "samples lost", "byte-identical after resume", "failures"], krows))
    print("\n## Damaged payload files\n")
    print(table(["format", "fault", "trials", "verify fails naming the file", "verify names the sample",
                 "reader: refused / raised / correct", "reader wrong or leaked", "undetected"], brows))
    print("\n## Hostile inputs (tests/formats/test_hostile.py)\n")
    print(table(["hostile input", "required", "outcome"], hrows))
    print("\n## Sources, destinations, readers and places (the trust tests)\n")
    print(table(["fault", "required", "outcome"], trows))
    print("\n## Object storage (tests/storage/test_remote.py, selected)\n")
    print(table(["fault", "required", "outcome"], rrows))
    print("\n## JPEGs that decode wrong without a warning (tests/images/test_imageproc.py, tests/datasets/test_crop.py)\n")
    print(table(["fault", "required", "outcome"], jrows))
    print("\n## The node-wide RAM cache (tests/datasets/shm/test_node_cache.py, selected)\n")
    print(table(["fault", "required", "outcome"], nrows))
    print(f"\n({time.time() - t0:.0f} s, python {sys.version.split()[0]}, {os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
