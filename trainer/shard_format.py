"""What a Parquet shard of trainer.shards is, for the writer and the reader alike: its file suffix
and the field metadata of a tensor column.

Apart from both so that neither imports the other: ``python -m trainer.shards write`` runs the
writer (trainer.shard_writer), which must not import the reader back.
"""

SUFFIX = ".parquet"
#: Field metadata of a tensor column (fixed_size_binary, written by trainer.shard_writer).
TENSOR_DTYPE, TENSOR_SHAPE = b"forja.dtype", b"forja.shape"
