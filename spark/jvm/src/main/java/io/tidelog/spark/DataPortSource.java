package io.tidelog.spark;

import java.util.Map;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code format("tidelog-dataport")}: batch reads of ranges planned in Python (spark/dataport.py),
 * from the brokers' data ports, in the JVM. Owns the entry point only: the schema comes from the
 * plan's {@code includeHeaders}, and a malformed plan fails here, when the DataFrame is loaded,
 * not later inside a task.
 */
public final class DataPortSource implements TableProvider, DataSourceRegister {
  public static final String NAME = "tidelog-dataport";

  @Override
  public String shortName() {
    return NAME;
  }

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return Columns.schema(ReadPlan.parse(options).includeHeaders);
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
    ReadPlan plan = ReadPlan.parse(new CaseInsensitiveStringMap(properties));
    return new DataPortTable(Columns.schema(plan.includeHeaders), plan);
  }
}
