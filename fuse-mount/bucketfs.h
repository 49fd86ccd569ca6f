/* The bucket filesystem behind mountBucket: an S3/R2 bucket (under a
 * prefix) as a directory, served by a FUSE process of its own on the host,
 * so credentials never enter the sandbox.
 *
 * Objects map to paths (key = prefix + path); directories come from
 * ListObjectsV2 with a delimiter, plus "dir/" markers for empty ones.
 * Reads fetch 4 MiB chunks by ranged GET into a local cache (4 ahead of a
 * sequential reader; the next small files of a directory being read are
 * fetched whole ahead); writes go to
 * the cache and are uploaded when the file is closed or fsync'd (in
 * parallel, in the background; multipart for large files). fsync returns
 * only once the object is in the bucket. Every change not yet uploaded is
 * journaled in the cache directory, so a crash of this process, of the
 * daemon, or a bucket that is away loses nothing acknowledged: the next
 * run (or a flush-only run) uploads it. Clean cached data is evicted past
 * a size cap, least recently used first. Rename is copy then delete (not
 * atomic); symlinks are objects holding their target; hard links are
 * refused. */
#pragma once

/* `sbx bucketfs`: reads its configuration (JSON, with the credentials) on
 * stdin, the /dev/fuse fd of its mount on fd 3, and reports "ok" or an
 * error on fd 4 once it has checked the bucket. Internal: the daemon runs
 * it. */
int sbx_bucketfs_main(int argc, char **argv);
