# The memory part of the pyACL test framework from seed article 000 (shared/seeds/000_*.txt),
# kept verbatim: tests run it unchanged against npumem.acl.
# test_framework.py - 完整的测试框架
import numpy as np
import time
from typing import Tuple, Optional
import acl

class AclnnTestFramework:
    """Aclnn算子测试框架"""
    
    def __init__(self, device_id: int = 0):
        self.device_id = device_id
        self.stream = None
        self._init_acl()
        
    def _init_acl(self):
        """初始化ACL环境"""
        ret = acl.init()
        if ret != 0:
            raise RuntimeError(f"ACL init failed: {ret}")
        
        ret = acl.rt.set_device(self.device_id)
        if ret != 0:
            acl.finalize()
            raise RuntimeError(f"Set device failed: {ret}")
            
        ret, self.stream = acl.rt.create_stream()
        if ret != 0:
            acl.rt.reset_device(self.device_id)
            acl.finalize()
            raise RuntimeError(f"Create stream failed: {ret}")
    
    def generate_test_data(self, shape: Tuple[int, ...], 
                          dtype: np.dtype = np.float32,
                          value_range: Tuple[float, float] = (-1.0, 1.0)):
        """生成测试数据"""
        low, high = value_range
        
        if dtype == np.float16:
            # 生成半精度数据
            data = np.random.uniform(low, high, shape).astype(np.float16)
        elif dtype == np.float32:
            data = np.random.uniform(low, high, shape).astype(np.float32)
        elif dtype == np.int32:
            data = np.random.randint(int(low), int(high), shape, dtype=np.int32)
        else:
            raise ValueError(f"Unsupported dtype: {dtype}")
            
        return data
    
    def allocate_device_memory(self, host_data: np.ndarray):
        """分配设备内存并拷贝数据"""
        data_size = host_data.nbytes
        
        # 分配设备内存
        ret, device_ptr = acl.rt.malloc(data_size, 
                                       acl.rt.malloc_type.HUGE_FIRST)
        if ret != 0:
            raise RuntimeError(f"Device malloc failed: {ret}")
            
        # 拷贝数据到设备
        ret = acl.rt.memcpy(device_ptr, data_size,
                           host_data.ctypes.data, data_size,
                           acl.rt.memcpy_kind.HOST_TO_DEVICE)
        if ret != 0:
            acl.rt.free(device_ptr)
            raise RuntimeError(f"Memcpy H2D failed: {ret}")
            
        return device_ptr
    
    def execute_operator(self, op_func, *args, **kwargs):
        """执行算子并测量性能"""
        # 预热
        for _ in range(3):
            op_func(*args, **kwargs)
        
        # 同步确保预热完成
        acl.rt.synchronize_stream(self.stream)
        
        # 实际测量
        start_time = time.perf_counter()
        
        for _ in range(10):  # 多次执行求平均
            op_func(*args, **kwargs)
            
        acl.rt.synchronize_stream(self.stream)
        end_time = time.perf_counter()
        
        avg_time = (end_time - start_time) / 10
        return avg_time
    
    def verify_results(self, device_output, expected_output, 
                      tolerance: float = 1e-5):
        """验证计算结果"""
        # 从设备拷贝结果
        output_host = np.empty_like(expected_output)
        ret = acl.rt.memcpy(output_host.ctypes.data, output_host.nbytes,
                           device_output, output_host.nbytes,
                           acl.rt.memcpy_kind.DEVICE_TO_HOST)
        if ret != 0:
            raise RuntimeError(f"Memcpy D2H failed: {ret}")
        
        # 比较结果
        if np.issubdtype(expected_output.dtype, np.floating):
            # 浮点数比较
            diff = np.abs(output_host - expected_output)
            max_diff = np.max(diff)
            avg_diff = np.mean(diff)
            
            if max_diff > tolerance:
                print(f"❌ Verification failed: max_diff={max_diff}, avg_diff={avg_diff}")
                return False
            else:
                print(f"✅ Verification passed: max_diff={max_diff}, avg_diff={avg_diff}")
                return True
        else:
            # 整数比较
            matches = np.array_equal(output_host, expected_output)
            if matches:
                print("✅ Verification passed: exact match")
            else:
                print("❌ Verification failed: mismatch")
            return matches
    
    def cleanup(self):
        """清理资源"""
        if self.stream:
            acl.rt.destroy_stream(self.stream)
        acl.rt.reset_device(self.device_id)
        acl.finalize()
