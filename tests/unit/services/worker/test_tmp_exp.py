from pyspark.sql import functions as F
from pyspark.sql import types as T


def test_exp(spark):
    df = spark.createDataFrame([('{"READING": 1, "reading": 2, "t": "10:11:12"}',), ('{"reading": 3}',)], "text string")
    merged = T.StructType([T.StructField("READING", T.IntegerType()), T.StructField("reading", T.IntegerType()),
                           T.StructField("t", T.TimeType()), T.StructField("_corrupt", T.StringType())])
    v = F.from_json("text", merged, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt"})
    print(df.select(v.alias("v")).collect())
    uniq = T.StructType([T.StructField("a", T.IntegerType()), T.StructField("b", T.IntegerType()),
                         T.StructField("c", T.TimeType()), T.StructField("_corrupt", T.StringType())])
    try:
        print(df.select(v.cast(uniq).alias("v")).select("v.a", "v.b", "v.c").collect())
    except Exception as e:
        print("CAST FAILED", str(e)[:300])
    try:
        print(df.select(v.alias("v")).select(F.col("v").getField("reading")).collect())
    except Exception as e:
        print("GETFIELD FAILED", str(e)[:200])
